package admission

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

func TestE12_AdmitsTheQualifiedProvider(t *testing.T) {
	cases := []struct {
		name       string
		provider   *prpv1.Provider
		driverKind string
	}{
		{"OpenCode", &prpv1.Provider{Kind: "opencode", Model: "openrouter/deepseek/deepseek-v4-flash-0731", PermissionMode: "deny"}, "opencode_server"},
		{"Claude ACPX", &prpv1.Provider{Kind: "acpx", Agent: "claude", Model: "claude-sonnet-5", PermissionMode: "approve-all"}, "acpx_runtime"},
		{"Codex ACPX", &prpv1.Provider{Kind: "acpx", Agent: "codex", Model: "gpt-5.6-sol", PermissionMode: "deny-all"}, "acpx_runtime"},
		{"Codex", &prpv1.Provider{Kind: "codex"}, "codex_app_server"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, Check(&prpv1.ExecutionInput{Provider: tc.provider}))
			require.Equal(t, tc.driverKind, DriverKind(tc.provider))
		})
	}
}

func TestE12_RejectsACPXPiBeforeConstructingABackend(t *testing.T) {
	// Check is what the API runs before storing a run, so a refusal here means
	// no backend or runner work ever starts.
	cases := []struct {
		name     string
		provider *prpv1.Provider
	}{
		{"seed shape", &prpv1.Provider{Kind: "acpx", Agent: "pi", Model: "pi-model"}},
		{"otherwise qualified", &prpv1.Provider{Kind: "acpx", Agent: "pi", Model: "pi-model", PermissionMode: "approve-all"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(&prpv1.ExecutionInput{Provider: tc.provider})
			require.Error(t, err)
			require.EqualValues(t, "provider_not_admitted", failure.CodeOf(err))
			require.Equal(t, codes.InvalidArgument, status.Code(err))
			require.Contains(t, err.Error(), "descriptor-confined verified launch")
			require.Equal(t, "provider.agent", refusedField(t, err))
		})
	}
}

func TestE12_RefusesUnqualifiedProviders(t *testing.T) {
	cases := []struct {
		name     string
		provider *prpv1.Provider
		field    string
	}{
		{"no provider", nil, "provider.kind"},
		{"unknown kind", &prpv1.Provider{Kind: "claude_managed"}, "provider.kind"},
		{"kind is case sensitive", &prpv1.Provider{Kind: "Codex"}, "provider.kind"},
		{"opencode bare model", &prpv1.Provider{Kind: "opencode", Model: "deepseek-v4", PermissionMode: "deny"}, "provider.model"},
		{"opencode empty model", &prpv1.Provider{Kind: "opencode", PermissionMode: "deny"}, "provider.model"},
		{"opencode empty provider part", &prpv1.Provider{Kind: "opencode", Model: "/deepseek-v4", PermissionMode: "deny"}, "provider.model"},
		{"opencode empty model part", &prpv1.Provider{Kind: "opencode", Model: "openrouter/", PermissionMode: "deny"}, "provider.model"},
		{"opencode empty middle part", &prpv1.Provider{Kind: "opencode", Model: "openrouter//x", PermissionMode: "deny"}, "provider.model"},
		{"opencode missing permission mode", &prpv1.Provider{Kind: "opencode", Model: "openrouter/x"}, "provider.permission_mode"},
		{"opencode acpx permission mode", &prpv1.Provider{Kind: "opencode", Model: "openrouter/x", PermissionMode: "deny-all"}, "provider.permission_mode"},
		{"acpx unknown agent", &prpv1.Provider{Kind: "acpx", Agent: "gemini", PermissionMode: "approve-all"}, "provider.agent"},
		{"acpx missing agent", &prpv1.Provider{Kind: "acpx", PermissionMode: "approve-all"}, "provider.agent"},
		{"acpx missing permission mode", &prpv1.Provider{Kind: "acpx", Agent: "claude"}, "provider.permission_mode"},
		{"acpx opencode permission mode", &prpv1.Provider{Kind: "acpx", Agent: "codex", PermissionMode: "deny"}, "provider.permission_mode"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(&prpv1.ExecutionInput{Provider: tc.provider})
			require.EqualValues(t, "provider_not_admitted", failure.CodeOf(err))
			require.Equal(t, codes.InvalidArgument, status.Code(err))
			require.Equal(t, tc.field, refusedField(t, err))
		})
	}
	require.Equal(t, "", DriverKind(&prpv1.Provider{Kind: "claude_managed"}))
	require.Equal(t, "", DriverKind(nil))
	require.EqualValues(t, "provider_not_admitted", failure.CodeOf(Check(nil)))
}

// refusedField reads the refused field from the error's gRPC ErrorInfo, as a
// client would.
func refusedField(t *testing.T, err error) string {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()[MetadataField]
		}
	}
	t.Fatalf("no ErrorInfo on %v", err)
	return ""
}
