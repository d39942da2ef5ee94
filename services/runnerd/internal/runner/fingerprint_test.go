package runner

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// TestT3_ARunAttachWithARotatedSecretIsTheSameCommand: the executor
// resolves a run's secrets afresh for each attempt, so a takeover after a
// rotation resends run.attach with other configured values. Its
// fingerprint leaves the values out (names stay in): it is the same
// command (the stored result, not command_id_reused), and no digest of a
// credential is journaled. A fingerprint a former runnerd journaled (with
// the values) still matches the same command.
func TestT3_ARunAttachWithARotatedSecretIsTheSameCommand(t *testing.T) {
	t.Parallel()
	attach := func(conf map[string]any) *prpv1.Command {
		p, err := structpb.NewStruct(map[string]any{"input": map[string]any{
			"task":        map[string]any{"prompt": "hi"},
			"environment": map[string]any{"configured": conf, "inherit": []any{"PATH"}},
		}})
		require.NoError(t, err)
		return &prpv1.Command{CommandId: "run-1:run.attach", Type: CmdRunAttach, RunId: "run-1", Payload: p}
	}
	v1, v2 := attach(map[string]any{"OPENAI_API_KEY": "sk-v1"}), attach(map[string]any{"OPENAI_API_KEY": "sk-v2"})
	fp1, err := Fingerprint(v1)
	require.NoError(t, err)
	fp2, err := Fingerprint(v2)
	require.NoError(t, err)
	require.Equal(t, fp1, fp2, "a rotated value is the same command")
	other, err := Fingerprint(attach(map[string]any{"GIT_TOKEN": "sk-v1"}))
	require.NoError(t, err)
	require.NotEqual(t, fp1, other, "the names are part of the command")
	require.Equal(t, "sk-v1", v1.GetPayload().GetFields()["input"].GetStructValue().GetFields()["environment"].GetStructValue().
		GetFields()["configured"].GetStructValue().GetFields()["OPENAI_API_KEY"].GetStringValue(), "the command itself is unchanged")
	legacy, err := legacyFingerprint(v1)
	require.NoError(t, err)
	require.NotEqual(t, fp1, legacy)
}
