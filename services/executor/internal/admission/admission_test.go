package admission

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

func TestCheckAdmitsOnlyLaunchableProviders(t *testing.T) {
	for kind, code := range map[string]string{"codex": "", "opencode": "provider_not_admitted", "acpx": "provider_not_admitted"} {
		err := Check(&prpv1.ExecutionInput{Provider: &prpv1.Provider{Kind: kind}})
		require.Equal(t, code, failure.CodeOf(err), kind)
	}
}
