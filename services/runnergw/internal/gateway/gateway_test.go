package gateway

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
)

func TestG2_BuildMetadataContract(t *testing.T) {
	cases := []struct {
		name, doc, mode, code string
	}{
		{"current", `{"schema":"tether/runnerd-build-metadata/v1","binaryName":"runnerd","binaryContractVersion":2,"prpTransportModes":["dial_ws_loopback","dial_wss"]}`, "dial_ws_loopback", ""},
		{"stale contract", `{"schema":"tether/runnerd-build-metadata/v1","binaryContractVersion":1,"prpTransportModes":["dial_ws_loopback"]}`, "dial_ws_loopback", "runner_remote_artifact_contract_incompatible"},
		{"missing mode, no fall-through", `{"schema":"tether/runnerd-build-metadata/v1","binaryContractVersion":2,"prpTransportModes":["dial_ws_loopback"]}`, "listen_ws", "runner_remote_transport_capability_missing:listen_ws"},
		{"wrong schema", `{"schema":"other","binaryContractVersion":2,"prpTransportModes":["dial_ws_loopback"]}`, "dial_ws_loopback", "runner_remote_artifact_contract_incompatible"},
		{"not json", `runnerd 1.0`, "dial_ws_loopback", "runner_remote_artifact_contract_incompatible"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := CheckBuildMetadata([]byte(c.doc), c.mode)
			require.Equal(t, c.code, failure.CodeOf(err))
			if c.code == "" {
				require.EqualValues(t, ContractVersion, m.GetBinaryContractVersion())
			}
		})
	}
}

func TestGatewayRefusesALowerAttemptThanSeen(t *testing.T) {
	g := New(Config{})
	require.NoError(t, g.fence("r", 2))
	require.NoError(t, g.fence("r", 2), "a re-attach of the same attempt is allowed")
	require.Equal(t, "runner_attempt_fenced", failure.CodeOf(g.fence("r", 1)))
	require.NoError(t, g.fence("r", 3))
	require.NoError(t, g.fence("other", 1))
}
