package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/tenancy"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// TestT3_Stack_ASecretReachesOnlyItsProviderAndIsWrittenNowhere runs the
// stack of make up-auth (tokens required) with real processes. acme's
// writer stores a secret (a canary) and a run names it; another run
// configures a plain value (a second canary), which the executor stores by
// reference. The fake codex receives both values; a rotation reaches the
// next provider launched. Then the canaries are looked for everywhere a
// run leaves a trace, and found nowhere: the responses of the calls that
// return runs, events and sessions, every executor, gateway, runnerd and
// verifier log, runs.input and the events in the database, the runner
// state on disk, and the checkpoint archive of the session's verified
// suspension.
func TestT3_Stack_ASecretReachesOnlyItsProviderAndIsWrittenNowhere(t *testing.T) {
	t.Parallel()
	const (
		secretV1 = "sk-T3-CANARY-v1-8d2f61"
		secretV2 = "sk-T3-CANARY-v2-4be190"
		plain    = "ghp-T3-CANARY-plain-77aa03"
	)
	envLog := filepath.Join(t.TempDir(), "provider.env")
	h := newHarness(t, stack.Options{Auth: true, FakeArgs: []string{"--env-log", envLog}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tok, err := h.st.Token("alice", time.Hour, "acme:writer")
	require.NoError(t, err)
	conn, err := grpcx.Dial(h.st.Addr("executor"), "", grpc.WithPerRPCCredentials(tenancy.Bearer(tok)))
	require.NoError(t, err)
	defer conn.Close()
	acme := executorv1.NewExecutorServiceClient(conn)
	h.client = acme
	var responses bytes.Buffer

	put, err := acme.PutSecret(ctx, &executorv1.PutSecretRequest{CompanyId: "acme", Name: "openai", Value: []byte(secretV1)})
	require.NoError(t, err)
	responses.WriteString(protojson.Format(put))

	in := h.submitInput("t3-a", "use your key")
	in.Environment = &prpv1.ProviderEnvironment{SecretRefs: map[string]string{"OPENAI_API_KEY": "openai"},
		Configured: map[string]string{"GIT_TOKEN": plain}}
	sub, err := acme.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "t3-a", Input: in})
	require.NoError(t, err)
	responses.WriteString(protojson.Format(sub))
	for _, ev := range h.watch(ctx, "t3-a", 0, nil) {
		responses.WriteString(protojson.Format(ev))
	}
	run := h.get("t3-a")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
	env := readEnvLog(t, envLog)
	require.Equal(t, secretV1, env["OPENAI_API_KEY"], "the named secret reaches the provider")
	require.Equal(t, plain, env["GIT_TOKEN"], "a plain configured value still reaches it (stored by reference)")
	require.Contains(t, run.GetInput().GetEnvironment().GetSecretRefs(), "GIT_TOKEN")

	// Rotation: the next provider launched gets the new version.
	put, err = acme.PutSecret(ctx, &executorv1.PutSecretRequest{CompanyId: "acme", Name: "openai", Value: []byte(secretV2)})
	require.NoError(t, err)
	require.EqualValues(t, 2, put.GetSecret().GetVersion())
	in2 := h.submitInput("t3-b", "use your rotated key")
	in2.Environment = &prpv1.ProviderEnvironment{SecretRefs: map[string]string{"OPENAI_API_KEY": "openai"}}
	_, err = acme.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "t3-b", Input: in2})
	require.NoError(t, err)
	h.watch(ctx, "t3-b", 0, nil)
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, h.get("t3-b").GetState())
	require.Equal(t, secretV2, readEnvLog(t, envLog)["OPENAI_API_KEY"], "a rotation reaches the next provider launched")

	// A verified suspension archives the first session's runner state.
	closed, err := acme.CloseSession(ctx, &executorv1.CloseSessionRequest{CompanyId: "acme", NormalizedSessionId: "t3-a", Suspend: true, Reason: "t3"})
	require.NoError(t, err)
	require.Len(t, closed.GetCheckpoints(), 1)
	responses.WriteString(protojson.Format(closed))

	for _, id := range []string{"t3-a", "t3-b"} {
		got, err := acme.GetRun(ctx, &executorv1.GetRunRequest{RunId: id})
		require.NoError(t, err)
		responses.WriteString(protojson.Format(got))
	}
	list, err := acme.ListRuns(ctx, &executorv1.ListRunsRequest{})
	require.NoError(t, err)
	responses.WriteString(protojson.Format(list))
	sess, err := acme.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: "t3-a"})
	require.NoError(t, err)
	responses.WriteString(protojson.Format(sess))
	secs, err := acme.ListSecrets(ctx, &executorv1.ListSecretsRequest{CompanyId: "acme"})
	require.NoError(t, err)
	responses.WriteString(protojson.Format(secs))
	again, err := acme.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "t3-a", Input: in})
	require.NoError(t, err)
	require.False(t, again.GetCreated(), "an identical resubmission is idempotent")
	responses.WriteString(protojson.Format(again))

	canaries := []string{secretV1, secretV2, plain}
	for _, c := range canaries {
		require.NotContains(t, responses.String(), c, "an API response carries a secret value")
	}
	// The database: every table of the executor and the verifier (run
	// inputs, events, checkpoints, interactions, the sealed secrets...).
	// The search finds what is there: the prompt, in runs.input and events.
	db := h.store()
	found, err := pgtest.FindInDatabase(ctx, db.Pool(), "use your rotated key", "executor", "backup")
	require.NoError(t, err)
	require.Contains(t, found, "executor.runs.input")
	for _, c := range canaries {
		found, err := pgtest.FindInDatabase(ctx, db.Pool(), c, "executor", "backup")
		require.NoError(t, err)
		require.Empty(t, found, "the database holds %s in clear", c)
	}
	// Every file the stack wrote: logs, runner state, checkpoint archives
	// (decompressed), staging.
	archives, blobs := 0, 0
	require.NoError(t, filepath.Walk(h.st.Dir(), func(p string, info os.FileInfo, err error) error {
		if err != nil || !info.Mode().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(h.st.BlobDir(), p); !filepath.IsAbs(rel) && rel != "" && rel[0] != '.' {
			blobs++
		}
		if len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b {
			zr, err := gzip.NewReader(bytes.NewReader(b))
			require.NoError(t, err)
			b, err = io.ReadAll(zr)
			require.NoError(t, err, p)
			archives++
		}
		for _, c := range canaries {
			require.NotContains(t, string(b), c, "%s holds a secret value", p)
		}
		return nil
	}))
	t.Logf("scanned %s (%d checkpoint blobs, %d compressed files)", h.st.Dir(), blobs, archives)
	require.Positive(t, blobs, "the suspension's checkpoint archive was scanned")
	require.FileExists(t, h.st.LogPath("executor"))
}
