package gateway

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/prp"
)

const currentMetadata = `{"schema":"tether/runnerd-build-metadata/v1","binaryName":"runnerd","packageName":"github.com/tether-run/tether/services/runnerd","binaryContractVersion":2,"prpTransportModes":["dial_ws_loopback","dial_wss","listen_ws"]}`

func TestG2_AcceptsTheCurrentContractWithTheRequiredTransport(t *testing.T) {
	t.Parallel()
	m, err := CheckBuildMetadata([]byte(currentMetadata), prp.ModeListenWS)
	require.NoError(t, err)
	require.EqualValues(t, ContractVersion, m.GetBinaryContractVersion())
	require.Equal(t, []string{prp.ModeDialWSLoopback, prp.ModeDialWSS, prp.ModeListenWS}, m.GetPrpTransportModes())
}

func TestG2_StaleContractFailsBeforeDispatch(t *testing.T) {
	t.Parallel()
	for name, doc := range map[string]string{
		"stale contract version": `{"schema":"tether/runnerd-build-metadata/v1","binaryName":"runnerd","binaryContractVersion":1,"prpTransportModes":["dial_ws_loopback","dial_wss","listen_ws"]}`,
		"wrong schema":           `{"schema":"other","binaryContractVersion":2,"prpTransportModes":["listen_ws"]}`,
		"not json":               `runnerd 1.0`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := CheckBuildMetadata([]byte(doc), prp.ModeListenWS)
			require.EqualValues(t, "runner_remote_artifact_contract_incompatible", failure.CodeOf(err))
		})
	}
}

func TestG2_RequiresTheSelectedTransportWithoutFallingThrough(t *testing.T) {
	t.Parallel()
	doc := `{"schema":"tether/runnerd-build-metadata/v1","binaryName":"runnerd","binaryContractVersion":2,"prpTransportModes":["dial_wss"]}`
	_, err := CheckBuildMetadata([]byte(doc), prp.ModeListenWS)
	require.EqualValues(t, "runner_remote_transport_capability_missing:listen_ws", failure.CodeOf(err))
	_, err = CheckBuildMetadata([]byte(doc), prp.ModeDialWSS)
	require.NoError(t, err, "the same build serves the mode it lists")
}

func TestGatewayRefusesALowerAttemptThanSeen(t *testing.T) {
	t.Parallel()
	g := New(Config{})
	require.NoError(t, g.fence("r", 2))
	require.NoError(t, g.fence("r", 2), "a re-attach of the same attempt is allowed")
	require.EqualValues(t, "runner_attempt_fenced", failure.CodeOf(g.fence("r", 1)))
	require.NoError(t, g.fence("r", 3))
	require.NoError(t, g.fence("other", 1))
}
