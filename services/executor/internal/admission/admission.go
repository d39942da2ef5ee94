// Package admission decides, before anything is stored, whether tether can
// run an execution input at all (SPEC E12). Field syntax is checked by
// protovalidate at the API edge; this checks what syntax cannot express.
//
// Admission is about the provider qualification only. A qualified OpenCode or
// ACPX provider is admitted here even though the runner gateway of this build
// separately refuses to launch it.
//
// It also bounds free-form values (structure.go: a tool's input_schema too
// deep or too large is invalid_request) and confines workspace.cwd to its
// company's workspace root (workspace_outside_root), SPEC T6.
//
// Every provider refusal is a gRPC InvalidArgument failure.Error with the single
// stable code provider_not_admitted (clients need one code for "this provider
// configuration cannot run"). Which provider field was refused is carried in
// the ErrorInfo metadata under "field": provider.kind, provider.agent,
// provider.model or provider.permission_mode. The ACPX pi refusal's message
// contains "descriptor-confined verified launch".
package admission

import (
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/provenv"
	"github.com/tether-run/tether/pkg/scope"
)

// MetadataField is the ErrorInfo metadata key naming the refused field.
const MetadataField = "field"

// Refused fields, as reported under MetadataField.
const (
	FieldKind           = "provider.kind"
	FieldAgent          = "provider.agent"
	FieldModel          = "provider.model"
	FieldPermissionMode = "provider.permission_mode"
)

var (
	openCodePermissionModes = []string{"allow", "ask", "deny"}
	acpxPermissionModes     = []string{"approve-all", "approve-reads", "deny-all"}
	acpxAgents              = []string{"claude", "codex"}
)

// Check returns a failure.Error when the input cannot be admitted: its
// free-form values too deep or too large (CheckStructures), or its provider
// not qualified.
func Check(in *prpv1.ExecutionInput) error {
	if err := CheckStructures(in); err != nil {
		return err
	}
	p := in.GetProvider()
	switch kind := p.GetKind(); kind {
	case provenv.KindCodex:
		return nil
	case provenv.KindOpenCode:
		if !providerModel(p.GetModel()) {
			return refuse(FieldModel,
				"opencode model %q must be in provider/model form", p.GetModel())
		}
		return permissionMode(kind, p.GetPermissionMode(), openCodePermissionModes)
	case provenv.KindACPX:
		switch agent := p.GetAgent(); {
		case agent == "pi":
			// Refused before any backend or runner work: pi cannot yet be
			// launched confined to its descriptor.
			return refuse(FieldAgent,
				"ACPX agent pi is unavailable until descriptor-confined verified launch is implemented")
		case !contains(acpxAgents, agent):
			return refuse(FieldAgent,
				"ACPX agent %q is not admitted; supported: %s", agent, strings.Join(acpxAgents, ", "))
		}
		return permissionMode(kind, p.GetPermissionMode(), acpxPermissionModes)
	default:
		return refuse(FieldKind,
			"provider %q is not admitted; supported: codex, opencode, acpx", kind)
	}
}

// DriverKind names the session driver for a provider, or "" for a kind tether
// does not know.
func DriverKind(p *prpv1.Provider) string {
	switch k := p.GetKind(); k {
	case provenv.KindCodex, provenv.KindOpenCode, provenv.KindACPX:
		return scope.DefaultDriverKind(k)
	}
	return ""
}

// providerModel reports whether model is provider/model: at least one '/',
// every segment non-empty (e.g. openrouter/deepseek/deepseek-v4-flash-0731).
func providerModel(model string) bool {
	parts := strings.Split(model, "/")
	if len(parts) < 2 {
		return false
	}
	for _, part := range parts {
		if strings.TrimSpace(part) == "" {
			return false
		}
	}
	return true
}

func permissionMode(kind, mode string, allowed []string) error {
	if contains(allowed, mode) {
		return nil
	}
	return refuse(FieldPermissionMode,
		"%s permission mode %q is not admitted; allowed: %s", kind, mode, strings.Join(allowed, ", "))
}

func contains(set []string, v string) bool {
	for _, s := range set {
		if s == v {
			return true
		}
	}
	return false
}

func refuse(field, format string, args ...any) error {
	err := failure.New(codes.InvalidArgument, failure.ProviderNotAdmitted, format, args...)
	err.Metadata = map[string]string{MetadataField: field}
	return err
}
