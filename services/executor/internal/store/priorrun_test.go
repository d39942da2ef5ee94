package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/scope/durable"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// The E13 prior-run checks against real run rows: every prior run is
// submitted through the store and moved to its state the way the executor
// does (claimed, terminal event persisted, failed, cancelled), the durable
// roots are real directories under t.TempDir(), and durable.Prepare consults
// the database through Store.PriorRunLookup.

const (
	e13Company = "company-e13"
	e13Agent   = "agent-e13"
)

// e13Input is an execution input of a codex run in a managed workspace.
func e13Input(company, agent, workspace, session string) *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider:  &prpv1.Provider{Kind: "codex", Model: "gpt-e13"},
		Binding:   &prpv1.Binding{CompanyId: company, AgentId: agent, IssueId: "ISS-e13", ExecutionWorkspaceId: workspace},
		Workspace: &prpv1.Workspace{Cwd: "/tmp/tether-e13-workspace"},
		Task:      &prpv1.Task{Prompt: "continue"},
		Session: &prpv1.Session{NormalizedSessionId: session, DriverKind: "codex_app_server",
			Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_PER_TURN}},
	}
}

// e13Run submits run id and moves it to state (queued, running, succeeded,
// failed or cancelled) through the store's own API.
func e13Run(t *testing.T, s *store.Store, id string, in *prpv1.ExecutionInput, state string) {
	t.Helper()
	ctx := context.Background()
	_, created, err := s.SubmitRun(ctx, id, in)
	require.NoError(t, err)
	require.True(t, created)
	switch state {
	case store.StateQueued:
	case store.StateCancelled:
		out, err := s.RecordCancellation(ctx, store.CancelRequest{RunID: id, Scope: "run", Reason: "e13 test", Actor: "test"})
		require.NoError(t, err)
		require.True(t, out.Active)
	default:
		c, err := s.ClaimRun(ctx, id, "owner-"+id, time.Minute, ctl, in.GetBinding(), nil)
		require.NoError(t, err)
		switch state {
		case store.StateRunning:
		case store.StateSucceeded:
			res, err := s.AppendEvents(ctx, c.Fence, []*prpv1.Event{event(id, "runner-"+id, 1, store.EventTerminal,
				map[string]any{"turnTerminalState": "completed", "runTerminalState": store.StateSucceeded})})
			require.NoError(t, err)
			require.True(t, res.Terminal)
		case store.StateFailed:
			require.NoError(t, s.FailRun(ctx, c.Fence, "runner_local_connect_failed", "the runner went away"))
		default:
			t.Fatalf("unknown state %q", state)
		}
	}
	rec, err := s.PriorRun(ctx, id)
	require.NoError(t, err)
	require.Equal(t, state, rec.Status)
}

// e13Identity is the durable identity a prior run left.
func e13Identity(runID, session string) durable.Identity {
	return durable.Identity{RunID: runID, NormalizedSessionID: session,
		RunnerInstanceID: "runner-of-" + runID, EnvironmentLeaseID: "lease-of-" + runID}
}

func e13WriteJSON(t *testing.T, path string, v any) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	b, err := json.Marshal(v)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
}

// e13Seed lays out a root as a runner leaves it: the control-plane identity
// and runnerd's runner state (nested identity) with lifecycle, plus a
// provider home file that must travel with the root.
func e13Seed(t *testing.T, root string, id durable.Identity, lifecycle string) {
	t.Helper()
	e13WriteJSON(t, filepath.Join(root, durable.ControlPlaneDir, durable.ControlPlaneFile),
		map[string]any{"schema": durable.ControlPlaneSchema, "identity": id})
	e13WriteJSON(t, filepath.Join(root, durable.RunnerDir, durable.RunnerStateFile), map[string]any{
		"schema": durable.RunnerStateSchema,
		"identity": map[string]any{
			"runnerInstanceId": id.RunnerInstanceID, "environmentLeaseId": id.EnvironmentLeaseID,
			"normalizedSessionId": id.NormalizedSessionID, "sessionScope": "scope",
		},
		"lifecycle": lifecycle, "nextSourceSeq": 4, "ackedSourceSeq": 3,
	})
	require.NoError(t, os.MkdirAll(filepath.Join(root, "codex-home"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(root, "codex-home", "thread.jsonl"), []byte(`{"thread":"t-1"}`+"\n"), 0o600))
}

// e13Tree is every regular file under dir by relative path, with its bytes.
func e13Tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = string(b)
		return nil
	}))
	require.NotEmpty(t, out)
	return out
}

func e13Exists(p string) bool { _, err := os.Lstat(p); return err == nil }

func e13Code(t *testing.T, err error, code string) *failure.Error {
	t.Helper()
	require.Error(t, err)
	require.EqualValues(t, code, failure.CodeOf(err), err.Error())
	var fe *failure.Error
	require.True(t, errors.As(err, &fe))
	return fe
}

// e13Quarantined asserts root was moved whole to exactly one
// <base>/quarantine/<root>.<reason>.* entry named by the failure.
func e13Quarantined(t *testing.T, base, root string, fe *failure.Error, reason durable.QuarantineReason, before map[string]string) {
	t.Helper()
	require.False(t, e13Exists(root), "the root was moved away")
	es, err := os.ReadDir(filepath.Join(base, durable.QuarantineDir))
	require.NoError(t, err)
	require.Len(t, es, 1)
	require.True(t, strings.HasPrefix(es[0].Name(), filepath.Base(root)+"."+string(reason)+"."), es[0].Name())
	dest := filepath.Join(base, durable.QuarantineDir, es[0].Name())
	require.Equal(t, dest, fe.Metadata[durable.MetaQuarantined])
	require.Equal(t, before, e13Tree(t, dest), "quarantined whole, control-plane included")
}

func e13NoQuarantine(t *testing.T, base string) {
	t.Helper()
	require.False(t, e13Exists(filepath.Join(base, durable.QuarantineDir)), "nothing was quarantined")
}

func e13Prepare(ctx context.Context, s *store.Store, base, runID string, in *prpv1.ExecutionInput) (*durable.Prepared, error) {
	return durable.Prepare(ctx, durable.Request{Base: base, Scope: scope.ParamsOf(runID, in).Key(), RunID: runID,
		PriorRuns: s.PriorRunLookup()})
}

func e13Root(base, runID string, in *prpv1.ExecutionInput) string {
	return filepath.Join(base, scope.ParamsOf(runID, in).Key().RootName())
}

func TestE13_DatabasePriorRunStillRunningFailsClosedUntouched(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := e13Input(e13Company, e13Agent, "ws-active", "session-active")
	for _, state := range []string{store.StateRunning, store.StateQueued} {
		t.Run(state, func(t *testing.T) {
			prior, cur := "run-active-prior-"+state, "run-active-next-"+state
			e13Run(t, s, prior, in, state)
			e13Run(t, s, cur, in, store.StateRunning)
			rec, err := s.PriorRun(ctx, prior)
			require.NoError(t, err)
			require.False(t, rec.Terminal)

			base := t.TempDir()
			root := e13Root(base, cur, in)
			e13Seed(t, root, e13Identity(prior, "session-active"), "ready")
			before := e13Tree(t, root)

			_, err = e13Prepare(ctx, s, base, cur, in)
			fe := e13Code(t, err, failure.RunnerStateIdentityMismatch)
			require.Equal(t, codes.FailedPrecondition, fe.GRPC)
			require.Contains(t, err.Error(), "prior run "+prior+" is still "+state)
			require.Equal(t, before, e13Tree(t, root), "root untouched")
			e13NoQuarantine(t, base)

			// The whole open fails the same way and leaves no claim or binding.
			a := &durable.Authority{Base: base, PriorRuns: s.PriorRunLookup()}
			_, err = a.Open(ctx, durable.LaunchRequest{RunID: cur, Params: scope.ParamsOf(cur, in), RunnerInstanceID: "runner-new"})
			e13Code(t, err, failure.RunnerStateIdentityMismatch)
			_, held := a.Claims.Holder(filepath.Base(root))
			require.False(t, held)
			require.Equal(t, before, e13Tree(t, root))
			e13NoQuarantine(t, base)
		})
	}
}

func TestE13_DatabaseTerminalSuspendedPriorRunIsContinuedUnderTheNewRunID(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := e13Input(e13Company, e13Agent, "ws-continue", "session-continue")
	for _, state := range []string{store.StateSucceeded, store.StateFailed} {
		t.Run(state, func(t *testing.T) {
			prior, cur := "run-continue-prior-"+state, "run-continue-next-"+state
			e13Run(t, s, prior, in, state)
			e13Run(t, s, cur, in, store.StateRunning)
			priorID := e13Identity(prior, "session-continue")

			base := t.TempDir()
			root := e13Root(base, cur, in)
			e13Seed(t, root, priorID, "suspended")
			before := e13Tree(t, root)

			p, err := e13Prepare(ctx, s, base, cur, in)
			require.NoError(t, err)
			require.Equal(t, durable.SourcePriorRun, p.Source)
			require.Equal(t, "verified_prior_run", string(p.Source))
			require.Equal(t, root, p.Root)
			require.Equal(t, priorID, *p.Binding)
			require.Equal(t, durable.RunnerSuspended, p.Runner)
			require.Empty(t, p.MigratedFrom)
			require.Equal(t, before, e13Tree(t, root), "preparing writes nothing")
			e13NoQuarantine(t, base)

			// The records PriorRuns reads, and the same records after a trip
			// over the wire to the gateway, verify the same way.
			recs, err := s.PriorRuns(ctx, cur, 0)
			require.NoError(t, err)
			wire := make([]durable.PriorRun, 0, len(recs))
			for _, pr := range store.PriorRunsProto(recs) {
				b, err := proto.Marshal(pr)
				require.NoError(t, err)
				got := &gatewayv1.PriorRun{}
				require.NoError(t, proto.Unmarshal(b, got))
				wire = append(wire, durable.PriorRunFromInput(got.GetRunId(), got.GetStatus(), got.GetTerminal(), got.GetInput()))
			}
			for _, lookup := range []durable.PriorRunLookup{store.PriorRunLookupOf(recs), durable.PriorRunsOf(wire...)} {
				q, err := durable.Prepare(ctx, durable.Request{Base: base, Scope: scope.ParamsOf(cur, in).Key(), RunID: cur, PriorRuns: lookup})
				require.NoError(t, err)
				require.Equal(t, p, q)
			}

			// The launch plan keeps the prior runner and lease under the new run id.
			plan, err := durable.PlanLaunch(p, durable.LaunchRequest{RunID: cur, Params: scope.ParamsOf(cur, in), RunnerInstanceID: "runner-unused"})
			require.NoError(t, err)
			require.Equal(t, root, plan.StateDirectory)
			require.Equal(t, durable.Identity{RunID: cur, NormalizedSessionID: "session-continue",
				RunnerInstanceID: priorID.RunnerInstanceID, EnvironmentLeaseID: priorID.EnvironmentLeaseID}, plan.Identity.Identity)

			// Opening binds the control plane to the continuation.
			a := &durable.Authority{Base: base, PriorRuns: s.PriorRunLookup()}
			sess, err := a.Open(ctx, durable.LaunchRequest{RunID: cur, Params: scope.ParamsOf(cur, in), RunnerInstanceID: "runner-unused"})
			require.NoError(t, err)
			defer sess.Release()
			require.Equal(t, durable.SourcePriorRun, sess.Prepared.Source)
			require.Equal(t, plan.Identity, sess.Plan.Identity)
			bound, why, err := durable.ReadControlPlaneIdentity(root)
			require.NoError(t, err, why)
			require.Equal(t, plan.Identity.Identity, *bound)
			after := e13Tree(t, root)
			require.Equal(t, before[filepath.Join(durable.RunnerDir, durable.RunnerStateFile)],
				after[filepath.Join(durable.RunnerDir, durable.RunnerStateFile)], "runner state is runnerd's")
			tb, err := sess.Tools.Binding()
			require.NoError(t, err)
			require.Equal(t, cur, tb.RunID)
			// A restart of the continuation now resumes as its exact run.
			again, err := e13Prepare(ctx, s, base, cur, in)
			require.NoError(t, err)
			require.Equal(t, durable.SourceExactRun, again.Source)
		})
	}
}

// A projectless run's workspace placeholder is its own run id; read with
// that run id, the persisted input of the prior run is the same transient
// scope as the continuation's.
func TestE13_DatabaseProjectlessContinuationIsVerified(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	prior, cur := "run-projectless-prior", "run-projectless-next"
	priorIn := e13Input(e13Company, e13Agent, prior, "session-projectless")
	curIn := e13Input(e13Company, e13Agent, cur, "session-projectless")
	e13Run(t, s, prior, priorIn, store.StateSucceeded)
	e13Run(t, s, cur, curIn, store.StateRunning)
	require.Equal(t, e13Root("", prior, priorIn), e13Root("", cur, curIn))

	base := t.TempDir()
	root := e13Root(base, cur, curIn)
	e13Seed(t, root, e13Identity(prior, "session-projectless"), "suspended")
	p, err := e13Prepare(ctx, s, base, cur, curIn)
	require.NoError(t, err)
	require.Equal(t, durable.SourcePriorRun, p.Source)
	require.Equal(t, "runner-of-"+prior, p.Binding.RunnerInstanceID)
}

func TestE13_DatabaseTerminalPriorRunWithReadyRunnerIsQuarantinedIndeterminate(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := e13Input(e13Company, e13Agent, "ws-ready", "session-ready")
	prior, cur := "run-ready-prior", "run-ready-next"
	e13Run(t, s, prior, in, store.StateSucceeded)
	e13Run(t, s, cur, in, store.StateRunning)

	base := t.TempDir()
	root := e13Root(base, cur, in)
	e13Seed(t, root, e13Identity(prior, "session-ready"), "ready")
	before := e13Tree(t, root)

	_, err := e13Prepare(ctx, s, base, cur, in)
	fe := e13Code(t, err, failure.RunnerStateIdentityMismatch)
	require.Contains(t, err.Error(), "runner state is not_suspended")
	e13Quarantined(t, base, root, fe, durable.IdentityIndeterminate, before)
}

func TestE13_DatabasePriorRunOfAnotherWorkspaceIsAScopeMismatch(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	prior, cur := "run-otherws-prior", "run-otherws-next"
	priorIn := e13Input(e13Company, e13Agent, "ws-elsewhere", "session-otherws")
	in := e13Input(e13Company, e13Agent, "ws-here", "session-otherws")
	e13Run(t, s, prior, priorIn, store.StateSucceeded)
	e13Run(t, s, cur, in, store.StateRunning)
	// Same company, agent and session: the session lookup finds it.
	recs, err := s.PriorRuns(ctx, cur, 0)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Equal(t, prior, recs[0].RunID)
	require.NotEqual(t, e13Root("", cur, in), e13Root("", prior, priorIn))

	t.Run("scoped root", func(t *testing.T) {
		base := t.TempDir()
		root := e13Root(base, cur, in)
		e13Seed(t, root, e13Identity(prior, "session-otherws"), "suspended")
		before := e13Tree(t, root)
		_, err := e13Prepare(ctx, s, base, cur, in)
		fe := e13Code(t, err, failure.RunnerStateIdentityMismatch)
		require.Contains(t, err.Error(), "another full session scope")
		e13Quarantined(t, base, root, fe, durable.IdentityMismatch, before)
	})
	t.Run("legacy root", func(t *testing.T) {
		base := t.TempDir()
		legacy := filepath.Join(base, scope.ParamsOf(cur, in).Key().LegacyRootNames()[0])
		e13Seed(t, legacy, e13Identity(prior, "session-otherws"), "suspended")
		before := e13Tree(t, legacy)
		_, err := e13Prepare(ctx, s, base, cur, in)
		e13Code(t, err, failure.RunnerStateIdentityMismatch)
		require.Equal(t, before, e13Tree(t, legacy), "legacy root left in place")
		require.False(t, e13Exists(e13Root(base, cur, in)))
		e13NoQuarantine(t, base)
	})
}

func TestE13_DatabaseLegacyRootOfAVerifiedPriorRunMigratesAtomically(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := e13Input(e13Company, e13Agent, "ws-legacy", "session-legacy")
	prior, cur := "run-legacy-prior", "run-legacy-next"
	e13Run(t, s, prior, in, store.StateSucceeded)
	e13Run(t, s, cur, in, store.StateRunning)
	key := scope.ParamsOf(cur, in).Key()
	names := key.LegacyRootNames()
	require.Len(t, names, 2)
	for i, name := range names {
		t.Run(fmt.Sprint("legacy layout ", i), func(t *testing.T) {
			base := t.TempDir()
			legacy := filepath.Join(base, name)
			priorID := e13Identity(prior, "session-legacy")
			e13Seed(t, legacy, priorID, "suspended")
			before := e13Tree(t, legacy)

			p, err := e13Prepare(ctx, s, base, cur, in)
			require.NoError(t, err)
			require.Equal(t, durable.SourcePriorRun, p.Source)
			require.Equal(t, legacy, p.MigratedFrom)
			require.Equal(t, filepath.Join(base, key.RootName()), p.Root)
			require.Equal(t, priorID, *p.Binding)
			require.False(t, e13Exists(legacy), "renamed, not copied")
			require.Equal(t, before, e13Tree(t, p.Root), "moved whole")
			e13NoQuarantine(t, base)
		})
	}
}

func TestE13_DatabaseLegacyRootOfARunningPriorRunFailsClosedInPlace(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := e13Input(e13Company, e13Agent, "ws-legacy-active", "session-legacy-active")
	prior, cur := "run-legacy-active-prior", "run-legacy-active-next"
	e13Run(t, s, prior, in, store.StateRunning)
	e13Run(t, s, cur, in, store.StateQueued)
	for _, lifecycle := range []string{"suspended", "ready"} {
		t.Run(lifecycle, func(t *testing.T) {
			base := t.TempDir()
			legacy := filepath.Join(base, scope.ParamsOf(cur, in).Key().LegacyRootNames()[1])
			e13Seed(t, legacy, e13Identity(prior, "session-legacy-active"), lifecycle)
			before := e13Tree(t, legacy)
			_, err := e13Prepare(ctx, s, base, cur, in)
			e13Code(t, err, failure.RunnerStateIdentityMismatch)
			require.Contains(t, err.Error(), "owned by run "+prior)
			require.Equal(t, before, e13Tree(t, legacy))
			require.False(t, e13Exists(e13Root(base, cur, in)))
			e13NoQuarantine(t, base)
		})
	}
}

func TestE13_DatabaseRunOnDiskWithoutARowIsIndeterminate(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := e13Input(e13Company, e13Agent, "ws-ghost", "session-ghost")
	cur := "run-ghost-next"
	e13Run(t, s, cur, in, store.StateRunning)
	rec, err := s.PriorRun(ctx, "run-ghost")
	require.NoError(t, err)
	require.Nil(t, rec)

	t.Run("scoped root is quarantined", func(t *testing.T) {
		base := t.TempDir()
		root := e13Root(base, cur, in)
		e13Seed(t, root, e13Identity("run-ghost", "session-ghost"), "suspended")
		before := e13Tree(t, root)
		_, err := e13Prepare(ctx, s, base, cur, in)
		fe := e13Code(t, err, failure.RunnerStateIdentityMismatch)
		require.Contains(t, err.Error(), "prior run run-ghost is unknown")
		e13Quarantined(t, base, root, fe, durable.IdentityIndeterminate, before)
	})
	t.Run("legacy root stays in place", func(t *testing.T) {
		base := t.TempDir()
		legacy := filepath.Join(base, scope.ParamsOf(cur, in).Key().LegacyRootNames()[0])
		e13Seed(t, legacy, e13Identity("run-ghost", "session-ghost"), "suspended")
		before := e13Tree(t, legacy)
		_, err := e13Prepare(ctx, s, base, cur, in)
		e13Code(t, err, failure.RunnerStateIdentityMismatch)
		require.Equal(t, before, e13Tree(t, legacy))
		e13NoQuarantine(t, base)
	})
}

func TestE13_DatabaseUnavailableLeavesEveryRootUntouched(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t, Migrator)
	ctx := context.Background()
	s, err := store.Open(ctx, dsn, runrules.New())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	in := e13Input(e13Company, e13Agent, "ws-down", "session-down")
	prior, cur := "run-down-prior", "run-down-next"
	// The prior run would verify: terminal, same scope, suspended.
	e13Run(t, s, prior, in, store.StateSucceeded)
	e13Run(t, s, cur, in, store.StateRunning)

	closed, err := store.Open(ctx, dsn, runrules.New())
	require.NoError(t, err)
	closed.Close()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	for _, tc := range []struct {
		name string
		ctx  context.Context
		s    *store.Store
	}{{"closed pool", ctx, closed}, {"cancelled context", cancelled, s}} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := tc.s.PriorRun(tc.ctx, prior)
			require.Error(t, err)
			require.Nil(t, rec)

			base := t.TempDir()
			root := e13Root(base, cur, in)
			e13Seed(t, root, e13Identity(prior, "session-down"), "suspended")
			before := e13Tree(t, root)
			_, err = e13Prepare(tc.ctx, tc.s, base, cur, in)
			fe := e13Code(t, err, failure.RunnerStateIdentityMismatch)
			require.Equal(t, codes.Unavailable, fe.GRPC)
			require.Contains(t, err.Error(), "could not be read")
			require.Equal(t, before, e13Tree(t, root))
			e13NoQuarantine(t, base)

			lbase := t.TempDir()
			legacy := filepath.Join(lbase, scope.ParamsOf(cur, in).Key().LegacyRootNames()[0])
			e13Seed(t, legacy, e13Identity(prior, "session-down"), "suspended")
			_, err = e13Prepare(tc.ctx, tc.s, lbase, cur, in)
			fe = e13Code(t, err, failure.RunnerStateIdentityMismatch)
			require.Equal(t, codes.Unavailable, fe.GRPC)
			require.Equal(t, before, e13Tree(t, legacy))
			require.False(t, e13Exists(e13Root(lbase, cur, in)))
			e13NoQuarantine(t, lbase)

			// Once the database answers, the same roots verify.
			p, err := e13Prepare(ctx, s, base, cur, in)
			require.NoError(t, err)
			require.Equal(t, durable.SourcePriorRun, p.Source)
			p, err = e13Prepare(ctx, s, lbase, cur, in)
			require.NoError(t, err)
			require.Equal(t, legacy, p.MigratedFrom)
		})
	}
}

// e13Summary is "run:status:terminal" per record, in order.
func e13Summary(recs []store.PriorRunRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = fmt.Sprintf("%s:%s:%t", r.RunID, r.Status, r.Terminal)
	}
	return out
}

func TestE13_PriorRunsListsTheSessionsOtherRunsOfTheSameCompanyAndAgentNewestFirst(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	inputs := map[string]*prpv1.ExecutionInput{}
	for _, r := range []struct{ id, company, agent, ws, session, state string }{
		{"p-old", e13Company, e13Agent, "ws-1", "session-list", store.StateSucceeded},
		{"p-otherws", e13Company, e13Agent, "ws-2", "session-list", store.StateFailed},
		{"x-company", "company-other", e13Agent, "ws-1", "session-list", store.StateSucceeded},
		{"x-agent", e13Company, "agent-other", "ws-1", "session-list", store.StateSucceeded},
		{"x-session", e13Company, e13Agent, "ws-1", "session-other", store.StateSucceeded},
		{"cur", e13Company, e13Agent, "ws-1", "session-list", store.StateRunning},
		{"p-cancelled", e13Company, e13Agent, "ws-1", "session-list", store.StateCancelled},
		{"p-queued", e13Company, e13Agent, "ws-1", "session-list", store.StateQueued},
	} {
		inputs[r.id] = e13Input(r.company, r.agent, r.ws, r.session)
		e13Run(t, s, r.id, inputs[r.id], r.state)
	}

	recs, err := s.PriorRuns(ctx, "cur", 0)
	require.NoError(t, err)
	for _, r := range recs {
		require.True(t, proto.Equal(inputs[r.RunID], r.Input), r.RunID)
	}
	require.Equal(t, []string{"p-queued:queued:false", "p-cancelled:cancelled:true",
		"p-otherws:failed:true", "p-old:succeeded:true"}, e13Summary(recs))

	two, err := s.PriorRuns(ctx, "cur", 2)
	require.NoError(t, err)
	require.Equal(t, e13Summary(recs[:2]), e13Summary(two))

	// The other company's run with the same session id sees none of them.
	other, err := s.PriorRuns(ctx, "x-company", 10)
	require.NoError(t, err)
	require.Empty(t, other)
	// A run sees the other runs of its session, not itself.
	fromOld, err := s.PriorRuns(ctx, "p-old", 10)
	require.NoError(t, err)
	require.Len(t, fromOld, 4)
	for _, r := range fromOld {
		require.NotEqual(t, "p-old", r.RunID)
		require.NotEqual(t, "x-company", r.RunID)
	}

	_, err = s.PriorRuns(ctx, "no-such-run", 10)
	require.EqualValues(t, "run_not_found", failure.CodeOf(err))

	// Wire and durable forms.
	for i, pr := range store.PriorRunsProto(recs) {
		require.Equal(t, recs[i].RunID, pr.GetRunId())
		require.Equal(t, recs[i].Status, pr.GetStatus())
		require.Equal(t, recs[i].Terminal, pr.GetTerminal())
		require.True(t, proto.Equal(recs[i].Input, pr.GetInput()))
		require.Equal(t, recs[i].NeverServed, pr.GetNeverServed())
		require.Equal(t, recs[i].RunnerInstanceID, pr.GetRunnerInstanceId())
		d := recs[i].Durable()
		want := durable.PriorRunFromInput(pr.GetRunId(), pr.GetStatus(), pr.GetTerminal(), pr.GetInput())
		want.NeverServed = pr.GetNeverServed()
		require.Equal(t, want, d)
		require.Equal(t, scope.ParamsOf(recs[i].RunID, inputs[recs[i].RunID]).Key(), *d.Scope)
	}
	lookup := store.PriorRunLookupOf(recs)
	pr, err := lookup(ctx, "p-old")
	require.NoError(t, err)
	require.True(t, pr.Terminal)
	pr, err = lookup(ctx, "x-company")
	require.NoError(t, err)
	require.Nil(t, pr, "not among the records")
}

// A run that names no session is in "session-<run id>"; a later run naming
// that session explicitly continues it.
func TestE13_PriorRunsMatchesAnUnnamedSessionByItsRunID(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	e13Run(t, s, "solo", e13Input(e13Company, e13Agent, "ws-1", ""), store.StateSucceeded)
	e13Run(t, s, "solo-2", e13Input(e13Company, e13Agent, "ws-1", ""), store.StateSucceeded)
	e13Run(t, s, "follow", e13Input(e13Company, e13Agent, "ws-1", "session-solo"), store.StateQueued)

	recs, err := s.PriorRuns(ctx, "follow", 0)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Equal(t, "solo", recs[0].RunID)
	require.Equal(t, "session-solo", recs[0].Durable().Scope.NormalizedSessionID)

	recs, err = s.PriorRuns(ctx, "solo", 0)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Equal(t, "follow", recs[0].RunID)

	recs, err = s.PriorRuns(ctx, "solo-2", 0)
	require.NoError(t, err)
	require.Empty(t, recs)
}

func TestE13_PriorRunsIsCappedAt64(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background()
	in := e13Input(e13Company, e13Agent, "ws-cap", "session-cap")
	n := store.MaxPriorRuns + 2
	for i := 0; i < n; i++ {
		_, _, err := s.SubmitRun(ctx, fmt.Sprintf("cap-%03d", i), in)
		require.NoError(t, err)
	}
	for _, limit := range []int{0, -1, store.MaxPriorRuns + 1, 1000} {
		recs, err := s.PriorRuns(ctx, "cap-000", limit)
		require.NoError(t, err)
		require.Len(t, recs, store.MaxPriorRuns)
		require.Equal(t, fmt.Sprintf("cap-%03d", n-1), recs[0].RunID, "newest first")
	}
	recs, err := s.PriorRuns(ctx, "cap-000", 3)
	require.NoError(t, err)
	require.Len(t, recs, 3)
}
