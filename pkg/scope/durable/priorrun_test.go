package durable

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
)

// persistedInput is an execution input as the executor persists it.
func persistedInput(company, agent, workspace, session string) *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider:  &prpv1.Provider{Kind: "codex", Model: "gpt-test"},
		Binding:   &prpv1.Binding{CompanyId: company, AgentId: agent, IssueId: "issue", ExecutionWorkspaceId: workspace},
		Workspace: &prpv1.Workspace{Cwd: "/tmp/tether-prior-run-test"},
		Session: &prpv1.Session{NormalizedSessionId: session, DriverKind: "codex_app_server",
			Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_PER_TURN}},
	}
}

func TestE13_PriorRunFromInputKeysThePersistedInputAsThatRuns(t *testing.T) {
	in := persistedInput("company", "agent", "workspace-1", "session-1")
	r := PriorRunFromInput("run-prior", "succeeded", true, in)
	require.Equal(t, "run-prior", r.RunID)
	require.Equal(t, "succeeded", r.Status)
	require.True(t, r.Terminal)
	require.NotNil(t, r.Scope)
	require.Equal(t, scope.FromRun("run-prior", in), *r.Scope)

	// No persisted input: no scope (indeterminate for VerifyPriorRun).
	none := PriorRunFromInput("run-none", "failed", true, nil)
	require.Nil(t, none.Scope)
	require.Equal(t, PriorRun{RunID: "run-none", Status: "failed", Terminal: true}, none)

	// A projectless run's workspace placeholder is its own run id: read as
	// that run's input, it is the transient workspace a continuation with
	// its own placeholder shares.
	prior := PriorRunFromInput("run-a", "succeeded", true, persistedInput("company", "agent", "run-a", "session-p"))
	next := scope.FromRun("run-b", persistedInput("company", "agent", "run-b", "session-p"))
	require.Equal(t, scope.WorkspaceTransient, prior.Scope.Workspace.Kind)
	require.Equal(t, next.RootName(), prior.Scope.RootName())

	// An unnamed session is "session-<run id>".
	unnamed := PriorRunFromInput("run-u", "running", false, persistedInput("company", "agent", "workspace-1", ""))
	require.Equal(t, "session-run-u", unnamed.Scope.NormalizedSessionID)
	require.False(t, unnamed.Terminal)
}

// The converted record drives Prepare exactly like a hand-built one: a
// terminal, suspended prior run of the same full scope is continued; the same
// run without a persisted input is quarantined indeterminate.
func TestE13_PriorRunFromInputVerifiesThroughPrepare(t *testing.T) {
	cur := execution("company", "run-from-input-next", "agent", "workspace-from-input", "session-from-input")
	priorIn := persistedInput("company", "agent", "workspace-from-input", "session-from-input")
	id := Identity{RunID: "run-from-input-prior", NormalizedSessionID: "session-from-input",
		RunnerInstanceID: "runner-from-input", EnvironmentLeaseID: "lease-from-input"}

	base := t.TempDir()
	root := filepath.Join(base, cur.Key().RootName())
	seedRoot(t, root, id, "suspended")
	p, err := Prepare(context.Background(), Request{Base: base, Scope: cur.Key(), RunID: cur.RunID,
		PriorRuns: PriorRunsOf(PriorRunFromInput(id.RunID, "succeeded", true, priorIn))})
	require.NoError(t, err)
	require.Equal(t, SourcePriorRun, p.Source)
	require.Equal(t, id, *p.Binding)

	base = t.TempDir()
	root = filepath.Join(base, cur.Key().RootName())
	seedRoot(t, root, id, "suspended")
	_, err = Prepare(context.Background(), Request{Base: base, Scope: cur.Key(), RunID: cur.RunID,
		PriorRuns: PriorRunsOf(PriorRunFromInput(id.RunID, "succeeded", true, nil))})
	fe := requireCode(t, err, failure.RunnerStateIdentityMismatch)
	require.False(t, exists(root))
	es := quarantineEntries(t, base)
	require.Len(t, es, 1)
	require.True(t, strings.HasPrefix(es[0].Name(), filepath.Base(root)+".identity_indeterminate."))
	require.Equal(t, filepath.Join(base, QuarantineDir, es[0].Name()), fe.Metadata[MetaQuarantined])
}
