package scope

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

func input(company, session string) *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"},
		Binding:  &prpv1.Binding{CompanyId: company, AgentId: "agent-1", IssueId: "ISS-1", ExecutionWorkspaceId: "ws-1"},
		Task:     &prpv1.Task{Prompt: "hi"},
		Workspace: &prpv1.Workspace{
			Cwd: "/tmp/ws",
		},
		Session: &prpv1.Session{NormalizedSessionId: session, Lifecycle: &prpv1.Lifecycle{
			Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM, IdleTimeout: durationpb.New(20 * time.Millisecond),
		}},
	}
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestScopeExcludesRunAndIssueButSeparatesCompanies(t *testing.T) {
	a := input("acme", "s1")
	b := proto.Clone(a).(*prpv1.ExecutionInput)
	b.Binding.IssueId = "ISS-2"
	b.Task.Prompt = "other"
	require.Equal(t, Of(a), Of(b))
	require.Equal(t, OfRun("run-1", a), OfRun("run-2", b))
	require.NotEqual(t, Of(a), Of(input("acme2", "s1")))
	require.NotEqual(t, Of(a), Of(input("acme", "s2")))
	require.Len(t, Of(a), 64)
	require.True(t, IsRootName(Of(a)))
}

func TestScopeSeparatesAgentWorkspaceAndProviderProfile(t *testing.T) {
	base := ParamsOf("run-1", input("acme", "s1"))
	root := base.Key().RootName()
	for name, mutate := range map[string]func(*Params){
		"agent":         func(p *Params) { p.AgentID = "agent-2" },
		"workspace":     func(p *Params) { p.ExecutionWorkspaceID = "ws-2" },
		"provider kind": func(p *Params) { p.Provider.Kind = "opencode" },
		"driver kind":   func(p *Params) { p.DriverKind = "other_driver" },
		"profile":       func(p *Params) { p.Provider.Profile = "acpx-codex@1" },
		"session":       func(p *Params) { p.NormalizedSessionID = "s2" },
	} {
		p := base
		mutate(&p)
		require.NotEqual(t, root, p.Key().RootName(), name)
	}
	for name, mutate := range map[string]func(*Params){
		"run":             func(p *Params) { p.RunID = "run-2" },
		"issue":           func(p *Params) { p.IssueID = "ISS-9" },
		"model":           func(p *Params) { p.Provider.Model = "gpt-x" },
		"approval policy": func(p *Params) { p.Provider.ApprovalPolicy = "on-request" },
		"permission mode": func(p *Params) { p.Provider.PermissionMode = "deny" },
		"runtime context": func(p *Params) { p.RuntimeContextDigest = "rc-2" },
		"lifecycle":       func(p *Params) { p.Lifecycle.IdleTimeout = time.Hour },
		"explicit driver": func(p *Params) { p.DriverKind = "codex_app_server" },
	} {
		p := base
		mutate(&p)
		require.Equal(t, root, p.Key().RootName(), name)
	}
}

func TestScopeProjectlessRunsShareTheTransientWorkspace(t *testing.T) {
	prior := ParamsOf("run-prior", input("acme", "s1"))
	prior.ExecutionWorkspaceID = "run-prior"
	next := prior
	next.RunID, next.ExecutionWorkspaceID = "run-next", "run-next"
	require.Equal(t, WorkspaceTransient, prior.Key().Workspace.Kind)
	require.Equal(t, "/tmp/ws", prior.Key().Workspace.Cwd)
	require.Equal(t, prior.Key().RootName(), next.Key().RootName())
	none := prior
	none.ExecutionWorkspaceID = ""
	require.Equal(t, prior.Key().RootName(), none.Key().RootName())
	managed := prior
	managed.ExecutionWorkspaceID = "ws-1"
	require.NotEqual(t, prior.Key().RootName(), managed.Key().RootName())
}

func TestScopeSessionIDDefaultsToRun(t *testing.T) {
	p := Params{RunID: "r1", CompanyID: "c", AgentID: "a", Provider: ProviderConfig{Kind: "codex"}}
	require.Equal(t, "session-r1", p.Key().NormalizedSessionID)
}

func TestScopeLegacyRootNames(t *testing.T) {
	require.Equal(t, sha("session-legacy-state"), LegacySessionRootName("session-legacy-state"))
	require.Equal(t, sha(`["company-former-scope","session-former-scope"]`),
		LegacyCompanySessionRootName("company-former-scope", "session-former-scope"))
	require.Equal(t, sha(`["a<b","s&1"]`), LegacyCompanySessionRootName("a<b", "s&1"))
	k := ParamsOf("r", input("acme", "s1")).Key()
	require.Equal(t, []string{sha(`["acme","s1"]`), sha("s1")}, k.LegacyRootNames())
}

func TestScopeCanonicalJSONIsSortedAndStable(t *testing.T) {
	k := ParamsOf("r", input("acme", "s1")).Key()
	require.Equal(t,
		`{"agentId":"agent-1","companyId":"acme","normalizedSessionId":"s1","provider":{"driverKind":"codex_app_server","identity":{"kind":"codex"}},"schema":"tether.session-scope.v2","workspace":{"executionWorkspaceId":"ws-1","kind":"managed"}}`,
		string(k.Canonical()))
	require.Equal(t, sha(string(k.Canonical())), k.Digest())
}

func TestConfigDigestTracksPinnedConfigurationOnly(t *testing.T) {
	base := ParamsOf("run-1", input("acme", "s1"))
	d := base.ConfigDigest()
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, d)
	same := base
	same.RunID, same.IssueID = "run-2", "ISS-2"
	require.Equal(t, d, same.ConfigDigest())
	def := base
	def.ExecutionMode = "default"
	require.Equal(t, d, def.ConfigDigest())
	for name, mutate := range map[string]func(*Params){
		"model":           func(p *Params) { p.Provider.Model = "gpt-x" },
		"approval policy": func(p *Params) { p.Provider.ApprovalPolicy = "on-request" },
		"permission mode": func(p *Params) { p.Provider.PermissionMode = "deny" },
		"sandbox":         func(p *Params) { p.Provider.Sandbox = "read-only" },
		"runtime context": func(p *Params) { p.RuntimeContextDigest = "rc-2" },
		"idle timeout":    func(p *Params) { p.Lifecycle.IdleTimeout = time.Hour },
		"lifecycle mode":  func(p *Params) { p.Lifecycle.Mode = LifecyclePerTurn },
		"execution mode":  func(p *Params) { p.ExecutionMode = "plan" },
		"company":         func(p *Params) { p.CompanyID = "other" },
	} {
		p := base
		mutate(&p)
		require.NotEqual(t, d, p.ConfigDigest(), name)
	}
}

func TestLifecycleDefaults(t *testing.T) {
	p := ParamsOf("r", input("acme", "s1"))
	require.True(t, p.Lifecycle.Warm())
	require.Equal(t, 20*time.Millisecond, p.Lifecycle.EffectiveIdleTimeout())
	require.Equal(t, DefaultIdleTimeout, Lifecycle{Mode: LifecycleWarm}.EffectiveIdleTimeout())
}

// TestP1_AScopesDigestIsRememberedNotRecomputed: the second digest of a key
// allocates nothing (the canonical JSON and its hash are not computed again;
// they were ≈ 6 % of the executor's CPU per SubmitRun), and it is the
// digest of the key's canonical JSON; past maxDigests keys the memory starts
// over and the digests stay right.
func TestP1_AScopesDigestIsRememberedNotRecomputed(t *testing.T) {
	k := Key{Schema: Schema, CompanyID: "acme", AgentID: "agent-1", NormalizedSessionID: "p1-digest",
		Workspace: Workspace{Kind: "transient"}, Provider: Provider{DriverKind: "codex", Identity: ProviderIdentity{Kind: "codex"}}}
	want := hexSHA256(k.Canonical())
	if got := k.Digest(); got != want {
		t.Fatalf("Digest = %s, want %s", got, want)
	}
	if n := testing.AllocsPerRun(100, func() {
		if k.Digest() != want {
			t.Fatal("digest changed")
		}
	}); n != 0 {
		t.Errorf("a remembered digest allocates %.0f times, want 0", n)
	}
	for i := range maxDigests + 10 {
		o := k
		o.NormalizedSessionID = fmt.Sprint("p1-digest-", i)
		if o.Digest() != hexSHA256(o.Canonical()) {
			t.Fatalf("digest of key %d", i)
		}
	}
	digests.mu.Lock()
	n := len(digests.m)
	digests.mu.Unlock()
	if n > maxDigests {
		t.Errorf("%d digests remembered, bound %d", n, maxDigests)
	}
	if k.Digest() != want {
		t.Error("digest after the memory started over")
	}
}
