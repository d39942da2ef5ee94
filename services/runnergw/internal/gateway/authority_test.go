package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// openPrior opens run runID with the executor's prior-run records.
func (rl *relay) openPrior(ctx context.Context, runID string, in *prpv1.ExecutionInput, prior ...*gatewayv1.PriorRun) (*gatewayv1.Opened, error) {
	return rl.openWith(ctx, runID, in, nil, prior...)
}

func terminalRun(runID string, in *prpv1.ExecutionInput) *gatewayv1.PriorRun {
	return &gatewayv1.PriorRun{RunId: runID, Status: "succeeded", Terminal: true, Input: in}
}

// suspendedScope runs run-1 of in to its end and suspends the scope's
// runner (lifecycle suspended, process gone). It returns the scope root and
// the suspension's receipt.
func suspendedScope(ctx context.Context, t *testing.T, rl *relay, in *prpv1.ExecutionInput) (string, *gatewayv1.SuspendRunnerResponse) {
	t.Helper()
	sc := scope.OfRun("run-1", in)
	_, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	rl.waitDetached(sc)
	resp, err := rl.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, RunId: "run-1"})
	require.NoError(t, err)
	root := filepath.Join(rl.cfg.StateRoot, sc)
	id, _, err := durable.ReadControlPlaneIdentity(root)
	require.NoError(t, err)
	require.NotNil(t, id, "the control plane names the run that holds the scope")
	require.Equal(t, "run-1", id.RunID)
	return root, resp
}

func controlPlane(t *testing.T, root string) *durable.Identity {
	t.Helper()
	id, why, err := durable.ReadControlPlaneIdentity(root)
	require.NoError(t, err)
	require.NotNil(t, id, why)
	return id
}

// quarantined returns the names under <state-root>/quarantine.
func quarantined(t *testing.T, rl *relay) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(rl.cfg.StateRoot, durable.QuarantineDir))
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func TestE13_GatewayContinuesAVerifiedPriorRunUnderItsRunnerAndLease(t *testing.T) {
	t.Parallel()
	rl, _ := newSuspendRelay(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	in := testInput("continue", "acme", "first")
	root, susp := suspendedScope(ctx, t, rl, in)
	before := controlPlane(t, root)

	next := testInput("continue", "acme", "second")
	opened, err := rl.openPrior(ctx, "run-2", next, terminalRun("run-1", in))
	require.NoError(t, err)
	require.Equal(t, string(durable.SourcePriorRun), opened.GetDurableSource())
	require.Equal(t, "run-1", opened.GetPreviousRunId())
	require.Equal(t, susp.GetRunnerInstanceId(), opened.GetRunnerInstanceId(), "the continuation keeps the verified runner instance")
	after := controlPlane(t, root)
	require.Equal(t, durable.Identity{RunID: "run-2", NormalizedSessionID: "continue",
		RunnerInstanceID: before.RunnerInstanceID, EnvironmentLeaseID: before.EnvironmentLeaseID}, *after,
		"the control plane names the new run under the prior run's runner and lease")
	require.Equal(t, susp.GetLeaseId(), after.EnvironmentLeaseID)

	// The continued runner serves the run and resumes the provider thread.
	_, evs := rl.turn(ctx, "run-2", nil, next, nil)
	require.Equal(t, "succeeded", evs[len(evs)-1].GetPayload().AsMap()["runTerminalState"])
	require.Empty(t, quarantined(t, rl))
}

func TestE13_GatewayRefusesWhileThePriorRunIsStillRunningAndMovesNothing(t *testing.T) {
	t.Parallel()
	rl, _ := newSuspendRelay(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	in := testInput("running", "acme", "first")
	root, _ := suspendedScope(ctx, t, rl, in)
	starts := countCalls(t, rl.callLog, "process-start")

	_, err := rl.openPrior(ctx, "run-2", in, &gatewayv1.PriorRun{RunId: "run-1", Status: "running", Input: in})
	require.EqualValues(t, failure.RunnerStateIdentityMismatch, failure.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "still running")
	require.Equal(t, "run-1", controlPlane(t, root).RunID, "the root is untouched")
	require.Empty(t, quarantined(t, rl), "nothing is quarantined")
	require.Equal(t, starts, countCalls(t, rl.callLog, "process-start"), "no provider started")
}

func TestE13_GatewayQuarantinesARootWhoseOwnershipIsUnprovenAndStartsNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, root string)
		prior  func(in *prpv1.ExecutionInput) []*gatewayv1.PriorRun
		reason string
	}{
		{
			name: "prior run terminal but its runner died with another run's turn in flight",
			setup: func(t *testing.T, root string) {
				path := filepath.Join(root, durable.RunnerDir, durable.RunnerStateFile)
				b, err := os.ReadFile(path)
				require.NoError(t, err)
				var doc map[string]any
				require.NoError(t, json.Unmarshal(b, &doc))
				// The runner died while ready with a turn of a run other
				// than the terminal one the control plane names in flight:
				// not a settled owner (one that died idle, or with the
				// terminal run's own turn not yet cleared, is resumed:
				// SPEC R8).
				doc["lifecycle"] = "ready"
				doc["activeTurn"] = map[string]any{"turnId": "provider-turn-9", "runId": "run-0", "attempt": 1}
				b, err = json.Marshal(doc)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(path, b, 0o600))
			},
			prior: func(in *prpv1.ExecutionInput) []*gatewayv1.PriorRun {
				return []*gatewayv1.PriorRun{terminalRun("run-1", in)}
			},
			reason: ".identity_indeterminate.",
		},
		{
			name:   "run unknown to the database",
			prior:  func(*prpv1.ExecutionInput) []*gatewayv1.PriorRun { return nil },
			reason: ".identity_indeterminate.",
		},
		{
			name: "prior run persisted under another full scope",
			prior: func(in *prpv1.ExecutionInput) []*gatewayv1.PriorRun {
				other := testInput("quarantine", "acme", "first")
				other.Binding.ExecutionWorkspaceId = "workspace-elsewhere"
				return []*gatewayv1.PriorRun{terminalRun("run-1", other)}
			},
			reason: ".identity_mismatch.",
		},
		{
			name: "control plane malformed",
			setup: func(t *testing.T, root string) {
				require.NoError(t, os.WriteFile(filepath.Join(root, durable.ControlPlaneDir, durable.ControlPlaneFile), []byte("{"), 0o600))
			},
			prior: func(in *prpv1.ExecutionInput) []*gatewayv1.PriorRun {
				return []*gatewayv1.PriorRun{terminalRun("run-1", in)}
			},
			reason: ".identity_indeterminate.",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rl, _ := newSuspendRelay(t)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			in := testInput("quarantine", "acme", "first")
			root, _ := suspendedScope(ctx, t, rl, in)
			if tc.setup != nil {
				tc.setup(t, root)
			}
			starts := countCalls(t, rl.callLog, "process-start")

			_, err := rl.openPrior(ctx, "run-2", in, tc.prior(in)...)
			require.EqualValues(t, failure.RunnerStateIdentityMismatch, failure.CodeOf(err), "%v", err)
			require.Contains(t, err.Error(), "quarantined")
			q := quarantined(t, rl)
			require.Len(t, q, 1)
			require.True(t, strings.HasPrefix(q[0], filepath.Base(root)+tc.reason), q[0])
			_, err = os.Lstat(root)
			require.True(t, os.IsNotExist(err), "the root was moved whole")
			_, err = os.Stat(filepath.Join(rl.cfg.StateRoot, durable.QuarantineDir, q[0], durable.ControlPlaneDir))
			require.NoError(t, err, "control-plane/ travels with the quarantined root")
			require.Equal(t, starts, countCalls(t, rl.callLog, "process-start"), "no provider started")
		})
	}
}

func TestE13_GatewayNeverFollowsASymlinkedRoot(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in := testInput("symlinked", "acme", "first")
	target := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(target, "keep"), []byte("x"), 0o600))
	root := filepath.Join(rl.cfg.StateRoot, scope.OfRun("run-1", in))
	require.NoError(t, os.Symlink(target, root))

	_, err := rl.openPrior(ctx, "run-1", in)
	require.EqualValues(t, failure.RunnerStateDirectoryUnsafe, failure.CodeOf(err), "%v", err)
	fi, err := os.Lstat(root)
	require.NoError(t, err)
	require.NotZero(t, fi.Mode()&os.ModeSymlink, "the link stays")
	entries, err := os.ReadDir(target)
	require.NoError(t, err)
	require.Len(t, entries, 1, "nothing written through the link")
	require.Empty(t, quarantined(t, rl))
	require.Zero(t, countCalls(t, rl.callLog, "process-start"))
}

func TestE13_GatewayMigratesALegacyRootOnlyForItsOwnRun(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A legacy root (sha256 of the session id) of an unrelated run stays.
	foreignIn := testInput("legacy-foreign", "acme", "first")
	foreign := filepath.Join(rl.cfg.StateRoot, scope.LegacySessionRootName("legacy-foreign"))
	require.NoError(t, durable.Bind(foreign, durable.Identity{RunID: "run-unrelated", NormalizedSessionID: "legacy-foreign",
		RunnerInstanceID: "runner-old", EnvironmentLeaseID: "lease-old"}))
	_, err := rl.openPrior(ctx, "run-1", foreignIn)
	require.EqualValues(t, failure.RunnerStateIdentityMismatch, failure.CodeOf(err), "%v", err)
	_, err = os.Stat(foreign)
	require.NoError(t, err, "the legacy root is left in place")
	_, err = os.Lstat(filepath.Join(rl.cfg.StateRoot, scope.OfRun("run-1", foreignIn)))
	require.True(t, os.IsNotExist(err))

	// The [company, session] legacy root of this very run moves into the
	// full scope atomically, and the run starts on it.
	in := testInput("legacy-mine", "acme", "first")
	legacy := filepath.Join(rl.cfg.StateRoot, scope.LegacyCompanySessionRootName("acme", "legacy-mine"))
	require.NoError(t, durable.Bind(legacy, durable.Identity{RunID: "run-1", NormalizedSessionID: "legacy-mine",
		RunnerInstanceID: "runner-legacy", EnvironmentLeaseID: "lease-legacy"}))
	opened, err := rl.openPrior(ctx, "run-1", in)
	require.NoError(t, err)
	require.Equal(t, string(durable.SourceExactRun), opened.GetDurableSource())
	require.Equal(t, "runner-legacy", opened.GetRunnerInstanceId(), "the run resumes under its stored runner")
	_, err = os.Lstat(legacy)
	require.True(t, os.IsNotExist(err), "the legacy root was moved")
	root := filepath.Join(rl.cfg.StateRoot, scope.OfRun("run-1", in))
	require.Equal(t, "lease-legacy", controlPlane(t, root).EnvironmentLeaseID)
}

func TestE10_ANewRunOnALiveRunnerRotatesTheRunAuthority(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	in := testInput("rotate", "acme", "first")
	sc := scope.OfRun("run-1", in)
	first, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	require.Equal(t, string(durable.SourceFresh), first.GetDurableSource())
	require.Empty(t, first.GetPreviousRunId())
	rl.waitDetached(sc)

	second, evs := rl.turn(ctx, "run-2", nil, testInput("rotate", "acme", "second"), nil)
	require.Equal(t, "succeeded", evs[len(evs)-1].GetPayload().AsMap()["runTerminalState"])
	require.True(t, second.GetReused(), "the warm runner serves the next run")
	require.Empty(t, second.GetDurableSource(), "nothing was launched")
	require.Equal(t, "run-1", second.GetPreviousRunId(), "the run authority rotated from run-1")
	require.Greater(t, second.GetToolAuthorityEpoch(), first.GetToolAuthorityEpoch(), "run-1's tool authority epoch is revoked")
	id := controlPlane(t, filepath.Join(rl.cfg.StateRoot, sc))
	require.Equal(t, "run-2", id.RunID)
	require.Equal(t, first.GetRunnerInstanceId(), id.RunnerInstanceID)
	require.Equal(t, 1, countCalls(t, rl.callLog, "process-start"), "one provider for both runs")
}

func TestR6_AListeningRunnerRelaunchedRightAfterASuspensionIsDialledAgain(t *testing.T) {
	t.Parallel()
	var fv *fakeVerifier
	rl := newRelay(t, func(c *Config) {
		var client backupv1.BackupVerifierClient
		fv, client = startFakeVerifier(t)
		c.Backup = client
	})
	_ = fv
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	target := &gatewayv1.RunnerTarget{Mode: gatewayv1.TransportMode_TRANSPORT_MODE_LISTEN_WS, RunnerIngressAuthorized: true}
	in := testInput("relisten", "acme", "first")
	sc := scope.OfRun("run-1", in)
	first, evs := rl.turn(ctx, "run-1", target, in, nil)
	requireSucceeded(t, evs)
	rl.waitDetached(sc)
	_, err := rl.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, RunId: "run-1"})
	require.NoError(t, err)

	// At once: the dial loop of the exited runner may still be winding
	// down; the new listener (another port) must be dialled anyway.
	rl.prior = []*gatewayv1.PriorRun{terminalRun("run-1", in)}
	second, evs := rl.turn(ctx, "run-2", target, testInput("relisten", "acme", "second"), nil)
	require.Equal(t, "succeeded", evs[len(evs)-1].GetPayload().AsMap()["runTerminalState"])
	require.False(t, second.GetReused())
	require.Equal(t, first.GetRunnerInstanceId(), second.GetRunnerInstanceId())
	require.Equal(t, gatewayv1.TransportMode_TRANSPORT_MODE_LISTEN_WS, rl.runner(sc).GetMode())
}

func TestB2_TheCodexHomeTemplateIsMaterialisedAtEachLaunchAndNeverBackedUp(t *testing.T) {
	t.Parallel()
	tmpl := t.TempDir()
	auth, conf := []byte(`{"OPENAI_API_KEY":"sk-template-secret"}`), []byte("[features]\nplugins = false\n")
	require.NoError(t, os.WriteFile(filepath.Join(tmpl, "auth.json"), auth, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(tmpl, "config.toml"), conf, 0o600))
	require.NoError(t, CheckCodexHomeTemplate(tmpl))
	var fv *fakeVerifier
	rl := newRelay(t, func(c *Config) {
		var client backupv1.BackupVerifierClient
		fv, client = startFakeVerifier(t)
		c.Backup = client
		c.CodexHomeTemplate = tmpl
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	in := testInput("template", "acme", "first")
	sc := scope.OfRun("run-1", in)
	home := filepath.Join(rl.cfg.StateRoot, sc, durable.CodexHomeDir)
	requireMaterialised := func() {
		t.Helper()
		for name, want := range map[string][]byte{"auth.json": auth, "config.toml": conf} {
			got, err := os.ReadFile(filepath.Join(home, name))
			require.NoError(t, err)
			require.Equal(t, want, got)
			fi, err := os.Stat(filepath.Join(home, name))
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
		}
	}
	_, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	requireMaterialised()
	rl.waitDetached(sc)

	resp, err := rl.client.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, RunId: "run-1"})
	require.NoError(t, err)
	fv.mu.Lock()
	archive := fv.archives[resp.GetCheckpoint().GetCheckpointId()]
	names := tarNames(t, archive)
	fv.mu.Unlock()
	require.True(t, names["codex-home/fake-codex-state.json"], "%v", names)
	require.False(t, names["codex-home/auth.json"], "credentials never travel")
	require.False(t, names["codex-home/config.toml"])
	require.NotContains(t, string(archive), "sk-template-secret")

	// The state is lost; the restored provider home gets the launch files
	// again from the template.
	require.NoError(t, os.RemoveAll(filepath.Join(rl.cfg.StateRoot, sc)))
	spec := &gatewayv1.RestoreSpec{CheckpointId: resp.GetCheckpoint().GetCheckpointId(), Stamp: resp.GetStamp(), LeaseId: resp.GetLeaseId()}
	_, err = rl.openWith(ctx, "run-2", in, spec)
	require.NoError(t, err)
	requireMaterialised()
}

func TestB2_ACodexHomeTemplateWithAnExposedCredentialIsRefused(t *testing.T) {
	t.Parallel()
	tmpl := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(tmpl, "auth.json"), []byte("{}"), 0o644))
	require.ErrorContains(t, CheckCodexHomeTemplate(tmpl), "chmod 600")
	require.NoError(t, os.Remove(filepath.Join(tmpl, "auth.json")))
	require.NoError(t, os.Symlink(filepath.Join(t.TempDir(), "x"), filepath.Join(tmpl, "config.toml")))
	require.ErrorContains(t, CheckCodexHomeTemplate(tmpl), "is a symlink")
	require.Error(t, CheckCodexHomeTemplate(filepath.Join(tmpl, "missing")))
	require.NoError(t, CheckCodexHomeTemplate(""))
}

func TestE13_TheDurableAuthorityIsObservableInMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	rl := newRelay(t, func(c *Config) { c.Metrics = reg })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	in := testInput("metrics", "acme", "first")
	_, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	rl.waitDetached(scope.OfRun("run-1", in))
	_, evs = rl.turn(ctx, "run-2", nil, testInput("metrics", "acme", "second"), nil)
	require.Equal(t, "succeeded", evs[len(evs)-1].GetPayload().AsMap()["runTerminalState"])
	// A symlinked root elsewhere is refused and counted.
	other := testInput("metrics-unsafe", "acme", "x")
	require.NoError(t, os.Symlink(t.TempDir(), filepath.Join(rl.cfg.StateRoot, scope.OfRun("run-x", other))))
	_, err := rl.openPrior(ctx, "run-x", other)
	require.EqualValues(t, failure.RunnerStateDirectoryUnsafe, failure.CodeOf(err))

	require.Equal(t, 1.0, testutil.ToFloat64(rl.g.metrics.launches.WithLabelValues("fresh")))
	require.Equal(t, 1.0, testutil.ToFloat64(rl.g.metrics.rotations))
	require.Equal(t, 1.0, testutil.ToFloat64(rl.g.metrics.refusals.WithLabelValues(failure.RunnerStateDirectoryUnsafe, "none")))
	n, err := testutil.GatherAndCount(reg, "tether_runnergw_durable_launches_total", "tether_runnergw_authority_rotations_total", "tether_runnergw_durable_refusals_total")
	require.NoError(t, err)
	require.Equal(t, 3, n)
}

func TestE13_TheStateRootIsCreatedWhenMissing(t *testing.T) {
	t.Parallel()
	g := New(Config{StateRoot: filepath.Join(t.TempDir(), "not", "yet")})
	defer g.Close()
	sc := strings.Repeat("ef", 32)
	prev, err := g.bindRun(g.runnerFor(sc), sc, "run-1", "s", "runner-1", 0)
	require.NoError(t, err)
	require.Empty(t, prev)
	require.Equal(t, "run-1", controlPlane(t, g.stateDir(sc)).RunID)
	fi, err := os.Stat(g.cfg.StateRoot)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
}

func TestG4_TheGatewayKeepsTheHighestAttemptsOfTheRecentRunsOnly(t *testing.T) {
	t.Parallel()
	g := New(Config{StateRoot: t.TempDir()})
	defer g.Close()
	require.NoError(t, g.fence("run-first", 3))
	for i := 0; i < maxFencedRuns; i++ {
		require.NoError(t, g.fence(fmt.Sprintf("run-%d", i), 1))
	}
	require.NoError(t, g.fence("run-7", 2))
	require.EqualValues(t, "runner_attempt_fenced", failure.CodeOf(g.fence("run-7", 1)), "a recent run stays fenced")
	g.mu.Lock()
	n := len(g.highest)
	_, kept := g.highest["run-first"]
	g.mu.Unlock()
	require.Equal(t, maxFencedRuns, n)
	require.False(t, kept, "the oldest run is forgotten")
}

// SPEC P4: the next warm run on the live runner is bound by the run.attach
// the runner journals before its effects, not by rewriting the control
// plane (two fsyncs on the turn's critical path); the binding every reader
// sees names it, and the gateway reports the run it took over from.
func TestP4_AWarmRunOnTheLiveRunnerIsBoundWithoutRewritingTheControlPlane(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	in := testInput("warm-bind", "acme", "first")
	sc := scope.Of(in)
	root := filepath.Join(rl.cfg.StateRoot, sc)
	_, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	rl.waitDetached(sc)
	cpFile := filepath.Join(root, durable.ControlPlaneDir, durable.ControlPlaneFile)
	before, err := os.ReadFile(cpFile)
	require.NoError(t, err)
	first := controlPlane(t, root)
	require.Equal(t, "run-1", first.RunID)

	opened, evs := rl.turn(ctx, "run-2", nil, testInput("warm-bind", "acme", "second"), nil)
	require.Equal(t, "succeeded", evs[len(evs)-1].GetPayload().AsMap()["runTerminalState"])
	require.True(t, opened.GetReused())
	require.Equal(t, "run-1", opened.GetPreviousRunId())
	after, err := os.ReadFile(cpFile)
	require.NoError(t, err)
	require.Equal(t, string(before), string(after), "the control plane was not rewritten")
	bound := *first
	bound.RunID = "run-2"
	require.Equal(t, bound, *controlPlane(t, root), "the runner's journaled run.attach binds run-2")
	rl.waitDetached(sc)

	opened, evs = rl.turn(ctx, "run-3", nil, testInput("warm-bind", "acme", "third"), nil)
	require.Equal(t, "succeeded", evs[len(evs)-1].GetPayload().AsMap()["runTerminalState"])
	require.Equal(t, "run-2", opened.GetPreviousRunId())
}

// SPEC P4: the gateway knows a warm runner's binding from the runner's
// answers — the run.attach it journaled and answered completed — so the
// next warm attach reads no runner state document or intent log; what it
// knows is what every reader of the disk finds.
func TestP4_AWarmAttachTakesTheBindingFromTheRunnersAnswerAsTheDiskHasIt(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	in := testInput("warm-known", "acme", "first")
	sc := scope.Of(in)
	root := filepath.Join(rl.cfg.StateRoot, sc)
	r := rl.g.runnerFor(sc)
	// known is the binding the gateway keeps for the live connection.
	known := func() *durable.Identity {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.bound == nil || r.bound.conn != r.conn || r.attachSent != 0 {
			return nil
		}
		id := r.bound.id
		return &id
	}
	diskBinds := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.diskBinds
	}
	_, evs := rl.turn(ctx, "run-1", nil, in, nil)
	requireSucceeded(t, evs)
	rl.waitDetached(sc)

	for i, run := range []string{"run-2", "run-3"} {
		reads := diskBinds()
		opened, evs := rl.turn(ctx, run, nil, testInput("warm-known", "acme", "next"), nil)
		require.Equal(t, "succeeded", evs[len(evs)-1].GetPayload().AsMap()["runTerminalState"])
		require.True(t, opened.GetReused())
		require.Equal(t, fmt.Sprintf("run-%d", i+1), opened.GetPreviousRunId())
		if i > 0 {
			require.Equal(t, reads, diskBinds(), "%s: the binding was known, not read", run)
		}
		// The answer to the run's run.attach binds it, as on disk.
		require.Eventually(t, func() bool { k := known(); return k != nil && k.RunID == run }, 30*time.Second, 5*time.Millisecond)
		require.Equal(t, *controlPlane(t, root), *known())
		rl.waitDetached(sc)
	}
}
