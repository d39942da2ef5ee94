package runner

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
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

// TestATypedCommandAndItsStructFormAreOneCommand: an executor of the
// previous release sends run.attach and turn.start with a Struct payload
// (the input as protojson, read into a map); this release sends typed
// bodies. A takeover across the upgrade resends the same command ids in
// the other form: both forms have one fingerprint (the stored result is
// resent, no second turn), and the runner reads the same input from both.
func TestATypedCommandAndItsStructFormAreOneCommand(t *testing.T) {
	t.Parallel()
	in := &prpv1.ExecutionInput{
		Task:        &prpv1.Task{Prompt: "hi"},
		Environment: &prpv1.ProviderEnvironment{Configured: map[string]string{"OPENAI_API_KEY": "sk"}, Inherit: []string{"PATH"}},
		Session:     &prpv1.Session{NormalizedSessionId: "s-1"},
	}
	// The previous release's executor: protojson, a map, a Struct.
	raw, err := protojson.Marshal(in)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	p, err := structpb.NewStruct(map[string]any{"input": m})
	require.NoError(t, err)
	legacy := &prpv1.Command{CommandId: "run-1/g1/run.attach", Type: CmdRunAttach, RunId: "run-1", Payload: p}
	typed := prp.NewCommand(&prpv1.RunAttach{Input: in})
	typed.CommandId, typed.RunId = legacy.CommandId, legacy.RunId
	fpLegacy, err := Fingerprint(legacy)
	require.NoError(t, err)
	fpTyped, err := Fingerprint(typed)
	require.NoError(t, err)
	require.Equal(t, fpLegacy, fpTyped)
	for _, c := range []*prpv1.Command{legacy, typed} {
		b, err := prp.RunAttachOf(c)
		require.NoError(t, err)
		require.True(t, proto.Equal(in, b.GetInput()), "%v", b.GetInput())
	}

	ts, err := structpb.NewStruct(map[string]any{"text": "hi"})
	require.NoError(t, err)
	fpLegacy, err = Fingerprint(&prpv1.Command{CommandId: "t", Type: CmdTurnStart, RunId: "run-1", Payload: ts})
	require.NoError(t, err)
	turn := prp.NewCommand(&prpv1.TurnStart{Text: "hi"})
	turn.CommandId, turn.RunId = "t", "run-1"
	fpTyped, err = Fingerprint(turn)
	require.NoError(t, err)
	require.Equal(t, fpLegacy, fpTyped)
}

// structFingerprint is the fingerprint as the previous code computed it:
// the payload as a Struct (a typed body's protojson read back), values
// blanked on the Struct, the Struct's protojson parsed again.
func structFingerprint(t *testing.T, c *prpv1.Command, blank bool) string {
	t.Helper()
	p, err := prp.LegacyPayload(c)
	require.NoError(t, err)
	if conf := p.GetFields()["input"].GetStructValue().GetFields()["environment"].GetStructValue().GetFields()["configured"].GetStructValue(); blank && len(conf.GetFields()) > 0 {
		p = proto.CloneOf(p)
		for _, v := range p.GetFields()["input"].GetStructValue().GetFields()["environment"].GetStructValue().GetFields()["configured"].GetStructValue().GetFields() {
			v.Kind = &structpb.Value_StringValue{}
		}
	}
	payload := json.RawMessage("{}")
	if p != nil {
		payload, err = protojson.Marshal(p)
		require.NoError(t, err)
	}
	b, err := prp.CanonicalJSON(map[string]any{"type": c.GetType(), "payload": payload, "runId": c.GetRunId()})
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestP4_ACommandIsFingerprintedFromItsOwnJSON: a command's fingerprint is
// computed from its body's protojson parsed once, without the Struct the
// previous code made of it and wrote again — the same fingerprints
// (journaled ones are compared with them) in fewer allocations.
func TestP4_ACommandIsFingerprintedFromItsOwnJSON(t *testing.T) {
	in := &prpv1.ExecutionInput{
		Task:        &prpv1.Task{Prompt: "hi \"there\"\n\u2028 🙂"},
		Environment: &prpv1.ProviderEnvironment{Configured: map[string]string{"OPENAI_API_KEY": "sk", "B": "x"}, Inherit: []string{"PATH", "HOME"}},
		Session:     &prpv1.Session{NormalizedSessionId: "s-1", Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
		Binding:     &prpv1.Binding{CompanyId: "co", AgentId: "ag"},
	}
	attach := prp.NewCommand(&prpv1.RunAttach{Input: in})
	attach.CommandId, attach.RunId, attach.Type = "run-1/run.attach", "run-1", CmdRunAttach
	turn := prp.NewCommand(&prpv1.TurnStart{Text: "hello"})
	turn.CommandId, turn.RunId, turn.Type = "run-1/turn.start", "run-1", CmdTurnStart
	untyped, err := structpb.NewStruct(map[string]any{"n": 1e21, "m": 1e-7, "z": 0.1, "i": 12345678, "neg": -2.5, "l": []any{nil, true, "s", map[string]any{"b": 1, "a": 2}},
		"input": map[string]any{"environment": map[string]any{"configured": map[string]any{"K": 3.0, "L": map[string]any{"x": "y"}}}}})
	require.NoError(t, err)
	cmds := []*prpv1.Command{attach, turn,
		{CommandId: "u", Type: "x.y", RunId: "run-2", Payload: untyped},
		{CommandId: "e", Type: CmdTurnInterrupt, RunId: "run-3"}}
	for _, c := range cmds {
		fp, err := Fingerprint(c)
		require.NoError(t, err)
		require.Equal(t, structFingerprint(t, c, true), fp, c.GetCommandId())
		legacy, err := legacyFingerprint(c)
		require.NoError(t, err)
		require.Equal(t, structFingerprint(t, c, false), legacy, c.GetCommandId())
	}
	old := testing.AllocsPerRun(100, func() { structFingerprint(t, attach, true) })
	allocs := testing.AllocsPerRun(100, func() { _, _ = Fingerprint(attach) })
	t.Logf("allocations per run.attach fingerprint: %.0f (through a Struct: %.0f)", allocs, old)
	require.Less(t, allocs, old*0.7)
}
