// Package admission decides, before anything is stored, whether tether can
// run an execution input at all. Field syntax is checked by protovalidate at
// the API edge; this checks what syntax cannot express.
package admission

import (
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// Check returns a failure.Error when the input cannot be admitted.
func Check(in *prpv1.ExecutionInput) error {
	switch kind := in.GetProvider().GetKind(); kind {
	case "codex":
		return nil
	default:
		// OpenCode and ACPX need launch profiles and provider packs that this
		// build does not ship yet.
		return failure.New(codes.InvalidArgument, "provider_not_admitted",
			"provider %q cannot be launched by this build; supported: codex", kind)
	}
}
