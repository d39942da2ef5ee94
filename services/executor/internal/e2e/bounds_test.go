package e2e

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// rawBytes is a request sent as it is: a Go client cannot marshal a string
// that is not valid UTF-8.
type rawBytes []byte

type rawCodec struct{ encoding.CodecV2 }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(rawBytes); ok {
		return mem.BufferSlice{mem.SliceBuffer(r)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// withInvalidPrompt is req marshalled with its prompt's last byte made 0xff.
func withInvalidPrompt(t *testing.T, req *executorv1.SubmitRunRequest) rawBytes {
	t.Helper()
	const marker = "PROMPT-UTF8-MARK"
	req.Input.Task.Prompt = marker
	b, err := proto.Marshal(req)
	require.NoError(t, err)
	i := strings.Index(string(b), marker)
	require.GreaterOrEqual(t, i, 0)
	b[i+len(marker)-1] = 0xff
	return b
}

func deepSchema(depth int) *structpb.Struct {
	s := &structpb.Struct{Fields: map[string]*structpb.Value{"type": structpb.NewStringValue("object")}}
	for range depth - 1 {
		s = &structpb.Struct{Fields: map[string]*structpb.Value{"properties": structpb.NewStructValue(s)}}
	}
	return s
}

func requireRefused(t *testing.T, err error, code failure.Reason, field string) {
	t.Helper()
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.Equal(t, code, failure.CodeOf(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), field)
}

// The probes against a real stack, each refused at submit with
// InvalidArgument naming the field; the genuine run beside them succeeds
// exactly once and the audit stays clean; no executor log line is larger
// than a capped value.
func TestT6_Stack_BadInputIsRefusedAtSubmitAndAGenuineRunStillSucceedsOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A 10 MiB run id.
	_, err := h.client.GetRun(ctx, &executorv1.GetRunRequest{RunId: strings.Repeat("r", 10<<20)})
	requireRefused(t, err, failure.InvalidRequest, "run_id")

	// Invalid UTF-8 in a prompt: InvalidArgument, not Internal.
	conn, err := h.st.DialAs(h.st.Addr("executor"), identity.Client)
	require.NoError(t, err)
	defer conn.Close()
	raw := withInvalidPrompt(t, &executorv1.SubmitRunRequest{RunId: "utf8", Input: h.submitInput("bad", "x")})
	err = conn.Invoke(ctx, executorv1.ExecutorService_SubmitRun_FullMethodName, raw, &executorv1.SubmitRunResponse{},
		grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(grpcproto.Name)}))
	requireRefused(t, err, failure.InvalidRequest, "input.task.prompt")

	// 500-, 3,000- and 20,000-deep input schemas: refused at submit.
	for _, depth := range []int{500, 3000, 20000} {
		in := h.submitInput("deep", "x")
		in.DynamicTools = []*prpv1.DynamicTool{{Name: "deep", InputSchema: deepSchema(depth)}}
		_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "deep", Input: in})
		requireRefused(t, err, failure.InvalidRequest, "input_schema")
	}

	// A caller-chosen path outside the company's workspace root.
	for _, cwd := range []string{"/any/path", filepath.Join(h.st.WorkspaceRoot(), "globex", "repo"),
		filepath.Join(h.st.WorkspaceRoot(), "acme", "..", "globex")} {
		in := h.submitInput("cwd", "x")
		in.Workspace = &prpv1.Workspace{Cwd: cwd}
		_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "cwd", Input: in})
		requireRefused(t, err, failure.WorkspaceOutsideRoot, "workspace")
	}
	_, err = os.Stat("/any/path")
	require.True(t, os.IsNotExist(err), "/any/path was created")

	// Nothing of the refused runs was stored.
	for _, id := range []string{"utf8", "deep", "cwd"} {
		_, err := h.client.GetRun(ctx, &executorv1.GetRunRequest{RunId: id})
		require.Equal(t, codes.NotFound, status.Code(err), id)
	}

	// The genuine run, with a schema of the deepest admitted nesting and a
	// workspace inside the root, succeeds once.
	in := h.submitInput("genuine", "hello")
	in.DynamicTools = []*prpv1.DynamicTool{{Name: "deep", InputSchema: deepSchema(32)}}
	in.Workspace = &prpv1.Workspace{Cwd: filepath.Join(h.st.WorkspaceRoot(), "acme", "repo")}
	_, err = h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "genuine", Input: in})
	require.NoError(t, err)
	h.requireOneTerminal(ctx, "genuine")
	run := h.get("genuine")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, run.GetState(), "%v", run.GetFailure())
	rep, code := auditStack(t, h.dsn)
	require.Equal(t, 0, code, "%+v", rep)

	f, err := os.Open(h.st.LogPath("executor"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		require.Less(t, len(sc.Bytes()), 64<<10, "an executor log line of %d bytes", len(sc.Bytes()))
	}
	require.NoError(t, sc.Err())
}

// A workspace.cwd inside the company's root at submit that resolves
// outside it (a symbolic link) is refused by the gateway before anything is
// created or launched there: the run fails with workspace_outside_root.
func TestT6_Stack_AWorkspaceLinkOutOfTheRootFailsTheRunAtTheGateway(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	outside := t.TempDir()
	acme := filepath.Join(h.st.WorkspaceRoot(), "acme")
	require.NoError(t, os.MkdirAll(acme, 0o700))
	require.NoError(t, os.Symlink(outside, filepath.Join(acme, "escape")))

	in := h.submitInput("escape", "hello")
	in.Workspace = &prpv1.Workspace{Cwd: filepath.Join(acme, "escape", "repo")}
	_, err := h.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "escape", Input: in})
	require.NoError(t, err)
	run := h.waitTerminal(ctx, "escape")
	require.Equal(t, executorv1.RunState_RUN_STATE_FAILED, run.GetState())
	require.Equal(t, string(failure.WorkspaceOutsideRoot), run.GetFailure().GetCode(), "%v", run.GetFailure())
	require.EqualValues(t, 1, run.GetAttempt(), "refused once, not retried")
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Empty(t, entries, "created outside the root")

	h.submit("inside", "inside", "hello")
	h.requireOneTerminal(ctx, "inside")
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, h.get("inside").GetState())
}
