package gateway

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// The gateway is where a session scope's durable state lives, so it is the
// E13 authority over it: <state-root>/<scope root name> is runnerd's
// --state-dir, its control-plane/control-plane-state.json names the run that
// holds the scope, and a runner is launched on it only for that exact run or
// for a prior run the executor's database proves terminal, of the same full
// scope, whose runner state is suspended. Anything else fails closed (the
// root quarantined or left untouched, per durable.Prepare) before a process
// starts.

// priorRuns is the E13 lookup over the executor's records of the Open
// (newest first), with the scope's previous run marked (SPEC R8).
func priorRuns(want scope.Key, recs []*gatewayv1.PriorRun) durable.PriorRunLookup {
	out := make([]durable.PriorRun, 0, len(recs))
	for _, r := range recs {
		rec := durable.PriorRunFromInput(r.GetRunId(), r.GetStatus(), r.GetTerminal(), r.GetInput())
		rec.NeverServed = r.GetNeverServed()
		out = append(out, rec)
	}
	durable.MarkPrevious(want, out)
	return durable.PriorRunsOf(out...)
}

// launchAuthority prepares the scope's root for run runID before any runner
// is launched on it, and binds the control plane to the run. The plan's
// identity is the runner instance and environment lease to launch with: a
// resumed or continued root keeps its own, a fresh one gets a new instance
// under the gateway's lease for the scope.
func (g *Gateway) launchAuthority(ctx context.Context, sc, runID string, in *prpv1.ExecutionInput, prior []*gatewayv1.PriorRun) (*durable.LaunchPlan, *durable.Prepared, error) {
	key := scope.FromRun(runID, in)
	if err := ensureStateRoot(g.cfg.StateRoot); err != nil {
		return nil, nil, err
	}
	prep, err := durable.Prepare(ctx, durable.Request{Base: g.cfg.StateRoot, Scope: key, RunID: runID, PriorRuns: priorRuns(key, prior)})
	if err != nil {
		g.metrics.refused(err)
		return nil, nil, err
	}
	plan, err := durable.PlanLaunch(prep, durable.LaunchRequest{
		RunID: runID, Params: scope.ParamsOf(runID, in),
		RunnerInstanceID: randomID("runner-"), EnvironmentLeaseID: LeaseFor(sc),
	})
	if err != nil {
		return nil, nil, err
	}
	if err := durable.Bind(prep.Root, plan.Identity.Identity); err != nil {
		return nil, nil, err
	}
	g.metrics.launches.WithLabelValues(string(prep.Source)).Inc()
	if prep.MigratedFrom != "" {
		g.metrics.migrations.Inc()
		g.log.Info("legacy durable root migrated into the session scope", "session_scope", sc, "from", prep.MigratedFrom, "run_id", runID)
	}
	return plan, prep, nil
}

// bindRun makes runID the holder of a live runner's scope (the live process
// is the proof of ownership). A runner whose identity the scope is bound to
// binds the run itself: the gateway forwards the run's run.attach, which the
// runner journals (fdatasync) before any of its effects, and the binding
// rule reads it there (durable/bound.go) — no control-plane rewrite on a
// warm turn's critical path (SPEC P4). Otherwise the control plane is
// re-bound to the run under the runner's own instance and lease, above
// controller seq sent (the last command sent to the runner). It returns the
// run that held the scope before, empty when it was this run or none.
//
// r.mu is held: the binding the gateway knows from r's live connection
// (r.binding) spares a warm attach reading and decoding the runner's state
// document and intent log again.
func (g *Gateway) bindRun(r *runner, sc, runID, sessionID, instanceID string, sent uint64) (string, error) {
	root := g.stateDir(sc)
	if err := ensureStateRoot(g.cfg.StateRoot); err != nil {
		return "", err
	}
	cur, err := r.binding(root)
	if err != nil {
		return "", err
	}
	lease := LeaseFor(sc)
	if cur != nil {
		if cur.RunnerInstanceID == instanceID && cur.EnvironmentLeaseID != "" && cur.NormalizedSessionID == sessionID {
			if cur.RunID == runID {
				return "", nil
			}
			return cur.RunID, nil
		}
		if cur.EnvironmentLeaseID != "" && cur.RunnerInstanceID == instanceID {
			lease = cur.EnvironmentLeaseID
		}
	}
	r.bound = nil // the next attach reads the new control plane
	if err := durable.BindAfter(root, durable.Identity{RunID: runID, NormalizedSessionID: sessionID,
		RunnerInstanceID: instanceID, EnvironmentLeaseID: lease}, sent); err != nil {
		return "", err
	}
	if cur == nil || cur.RunID == runID {
		return "", nil
	}
	return cur.RunID, nil
}

// archiveState moves the scope's runner state and provider home aside into
// <root>/continuity-breaks/<unix ms>-<random>/, so the next run restores the
// scope's stamped checkpoint instead of resuming the local state. The
// control plane stays: it still names the run that holds the scope.
func archiveState(root string) (string, error) {
	sub := filepath.Join("continuity-breaks", time.Now().UTC().Format("20060102T150405.000Z")+"-"+randomID("")[:12])
	dest := filepath.Join(root, sub)
	d, err := openScopeDir(root, sub, true) // no link followed on the way (SPEC T7)
	if err != nil {
		return "", err
	}
	d.Close()
	// The provider home first: runner/runner-state.json is what marks the
	// scope as having state, so it goes last.
	for _, d := range append(slices.Clone(providerHomes), durable.RunnerDir) {
		src := filepath.Join(root, d)
		if _, err := os.Lstat(src); os.IsNotExist(err) {
			continue
		}
		if err := os.Rename(src, filepath.Join(dest, d)); err != nil {
			return "", err
		}
	}
	if f, err := os.Open(root); err == nil {
		_ = f.Sync()
		f.Close()
	}
	return dest, nil
}

// ensureStateRoot creates the state base (0700) when it does not exist yet.
func ensureStateRoot(base string) error {
	if err := os.MkdirAll(base, 0o700); err != nil {
		return failure.Wrap(err, codes.Internal, failure.RunnerStateIOFailed, "creating the state root %s: %v", base, err)
	}
	return nil
}

// boundRun is the scope's binding as the gateway knows it from the live
// runner connection conn, without reading the disk (SPEC P4). It is taken
// from a read (durable.ReadBinding) made while the binding rule applied and
// no run.attach was outstanding on conn, and follows the binding rule from
// there: a run.attach conn's runner answered completed was journaled (its
// intent is durable before its effect, its outcome before its answer) with
// the highest controller seq so far, so it binds the scope to its run — the
// run every reader of the disk finds. Anything else forgets it: a
// run.attach whose answer is not seen or not completed (it may or may not
// have been journaled), another connection, a control-plane write.
type boundRun struct {
	conn *prp.Conn
	id   durable.Identity
}

// binding returns root's binding (r.mu held): the one kept for the live
// connection, else read from disk (and kept when the rule applies).
func (r *runner) binding(root string) (*durable.Identity, error) {
	if b := r.bound; b != nil && b.conn == r.conn && r.conn != nil && r.attachSent == 0 {
		id := b.id
		return &id, nil
	}
	r.bound = nil
	r.diskBinds++
	cur, journaled, _, err := durable.ReadBinding(root)
	if err != nil {
		return nil, err
	}
	if cur != nil && journaled && r.conn != nil && r.attachSent == 0 {
		r.bound = &boundRun{conn: r.conn, id: *cur}
	}
	return cur, nil
}

// sentAttach notes a run.attach written (or perhaps written) to the
// runner's connection (r.mu held): the binding is unknown until its answer.
func (r *runner) sentAttach(cmd *prpv1.Command) {
	if cmd.GetType() == runnerstate.CmdRunAttach {
		r.attachSent = cmd.GetControllerSeq()
	}
}

// answered applies the runner's answer to a command, received on conn c
// (r.mu held): the outstanding run.attach, answered completed, binds the
// scope to its run; otherwise the binding is read from disk next time.
func (r *runner) answered(c *prp.Conn, res *prpv1.CommandResult) {
	if res.GetCommandType() != runnerstate.CmdRunAttach || r.attachSent == 0 || res.GetControllerSeq() != r.attachSent || c != r.conn {
		return
	}
	r.attachSent = 0
	if b := r.bound; b != nil && b.conn == c && res.GetStatus() == runnerstate.StatusCompleted && res.GetRunId() != "" {
		b.id.RunID = res.GetRunId()
		return
	}
	r.bound = nil
}
