package e2e

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// interactionsOf waits until the run has n interactions and returns them.
func (h *harness) interactionsOf(ctx context.Context, runID string, n int) []*executorv1.Interaction {
	h.t.Helper()
	for {
		resp, err := h.client.ListInteractions(ctx, &executorv1.ListInteractionsRequest{RunId: runID})
		require.NoError(h.t, err)
		if len(resp.GetInteractions()) >= n {
			return resp.GetInteractions()
		}
		select {
		case <-ctx.Done():
			h.t.Fatalf("run %s: want %d interactions, have %d", runID, n, len(resp.GetInteractions()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// askUserTitle is the title of the fake's tether_ask_user call.
const askUserTitle = "the fake's color choice"

func requireCode(t *testing.T, err error, grpc codes.Code, code string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, grpc, status.Code(err), "%v", err)
	require.EqualValues(t, code, failure.CodeOf(err), "%v", err)
}

// The fake calls the built-in tether_ask_user tool on "[wait]": the run
// yields on the durable interaction; the answer, given over the API,
// submits one continuation run that continues the same warm provider
// session with the answer.
func TestE4_Stack_AToolCallYieldsAndItsAnswerContinuesTheWarmSession(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("ask-1", "governed", "[wait] paint the fence")
	first := h.waitState(ctx, h.client, "ask-1", executorv1.RunState_RUN_STATE_SUCCEEDED)

	list := h.interactionsOf(ctx, "ask-1", 1)
	require.Len(t, list, 1)
	ia := list[0]
	id := ia.GetInteractionId()
	require.Equal(t, "ask_user_questions", ia.GetKind())
	require.Equal(t, "pending", ia.GetStatus())
	require.Equal(t, "response_wake", ia.GetContinuationPolicy())
	require.Equal(t, askUserTitle, ia.GetTitle())
	require.Len(t, ia.GetQuestions(), 1)
	require.Equal(t, "color", ia.GetQuestions()[0].GetId())

	res := first.GetResult()
	require.Equal(t, "yielded", res.GetReportedWorkDisposition())
	require.Equal(t, "Waiting for "+askUserTitle+".", res.GetSummary())
	require.Equal(t, "response_wake", res.GetContinuation().GetKind())
	require.Equal(t, "interaction-response:"+id, res.GetContinuation().GetIdempotencyKey())
	require.Equal(t, []string{"interaction:" + id}, res.GetEvidenceRefs())

	// Bad input: each a stable code, nothing written.
	_, err := h.client.AnswerInteraction(ctx, &executorv1.AnswerInteractionRequest{InteractionId: "ia-missing",
		Answers: []*executorv1.InteractionAnswer{{QuestionId: "color", OptionIds: []string{"red"}}}})
	requireCode(t, err, codes.NotFound, "interaction_not_found")
	_, err = h.client.AnswerInteraction(ctx, &executorv1.AnswerInteractionRequest{InteractionId: id,
		Answers: []*executorv1.InteractionAnswer{{QuestionId: "color", OptionIds: []string{"green"}}}})
	requireCode(t, err, codes.InvalidArgument, "interaction_answer_invalid")
	got, err := h.client.GetInteraction(ctx, &executorv1.GetInteractionRequest{InteractionId: id})
	require.NoError(t, err)
	require.Equal(t, "pending", got.GetInteraction().GetStatus())
	require.Empty(t, got.GetInteraction().GetAnswers())
	runs, err := h.client.ListRuns(ctx, &executorv1.ListRunsRequest{})
	require.NoError(t, err)
	require.Len(t, runs.GetRuns(), 1, "a refused answer submits nothing")

	red := &executorv1.AnswerInteractionRequest{InteractionId: id,
		Answers: []*executorv1.InteractionAnswer{{QuestionId: "color", OptionIds: []string{"red"}}}}
	a1, err := h.client.AnswerInteraction(ctx, red)
	require.NoError(t, err)
	require.True(t, a1.GetCreated())
	wake := a1.GetContinuationRun().GetRunId()
	require.NotEmpty(t, wake)
	a2, err := h.client.AnswerInteraction(ctx, red)
	require.NoError(t, err)
	require.False(t, a2.GetCreated())
	require.Equal(t, wake, a2.GetContinuationRun().GetRunId(), "the same answer twice: the same run")
	_, err = h.client.AnswerInteraction(ctx, &executorv1.AnswerInteractionRequest{InteractionId: id,
		Answers: []*executorv1.InteractionAnswer{{QuestionId: "color", OptionIds: []string{"blue"}}}})
	requireCode(t, err, codes.FailedPrecondition, "interaction_already_answered")

	next := h.waitState(ctx, h.client, wake, executorv1.RunState_RUN_STATE_SUCCEEDED)
	require.Empty(t, next.GetResult().GetReportedWorkDisposition(), "the answered interaction is no wait target")
	require.Equal(t, first.GetResult().GetProviderThreadId(), next.GetResult().GetProviderThreadId(), "the same provider thread")
	sameProcess(t, first.GetProviderProcess(), next.GetProviderProcess(), "provider")
	sameProcess(t, first.GetRunnerProcess(), next.GetRunnerProcess(), "runner")
	require.Contains(t, next.GetResult().GetFinalMessage(), "red", "the answer reached the provider")
	resp := next.GetInput().GetInteractionResponses()
	require.Len(t, resp, 1)
	require.Equal(t, id, resp[0].GetInteractionId())
	require.Equal(t, []string{"red"}, resp[0].GetAnswers()[0].GetOptionIds())

	got, err = h.client.GetInteraction(ctx, &executorv1.GetInteractionRequest{InteractionId: id})
	require.NoError(t, err)
	require.Equal(t, "answered", got.GetInteraction().GetStatus())
	require.Equal(t, wake, got.GetInteraction().GetContinuationRunId())
	runs, err = h.client.ListRuns(ctx, &executorv1.ListRunsRequest{})
	require.NoError(t, err)
	require.Len(t, runs.GetRuns(), 2, "one continuation run")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "thread/start"), "one provider conversation")
}

// The provider dies while its user-input request ("[ask]") is open: runnerd
// announces the request expired (provider_process_lost, replayAllowed
// false) and the executor keeps the question as one durable
// ask_user_questions interaction, counted by content-free metrics.
func TestE5_Stack_AQuestionLostWithItsProviderBecomesOneDurableInteraction(t *testing.T) {
	t.Parallel()
	port, err := stack.FreePort()
	require.NoError(t, err)
	metricsAddr := "127.0.0.1:" + strconv.Itoa(port)
	h := newHarness(t, stack.Options{ExecutorArgs: []string{"-metrics-addr", metricsAddr}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.submit("lost-1", "lost", "[ask] which color")
	var requestID string
	wctx, stop := context.WithCancel(ctx)
	stream, err := h.client.WatchRun(wctx, &executorv1.WatchRunRequest{RunId: "lost-1"})
	require.NoError(t, err)
	for requestID == "" {
		m, err := stream.Recv()
		require.NoError(t, err)
		if m.GetEvent().GetEventType() == "runtime_request.created" {
			requestID, _ = m.GetEvent().GetPayload().AsMap()["requestId"].(string)
		}
	}
	stop()
	pid := h.get("lost-1").GetProviderProcess().GetPid()
	require.NotZero(t, pid)
	require.NoError(t, syscall.Kill(int(pid), syscall.SIGKILL))

	list := h.interactionsOf(ctx, "lost-1", 1)
	require.Len(t, list, 1)
	ia := list[0]
	require.Equal(t, "runtime-input-durable:v1:lost-1:"+requestID, ia.GetIdempotencyKey())
	require.Equal(t, "ask_user_questions", ia.GetKind())
	require.Equal(t, "wake_assignee", ia.GetContinuationPolicy())
	require.Equal(t, requestID, ia.GetRuntimeRequestId())
	require.Len(t, ia.GetQuestions(), 1)
	var labels []string
	for _, o := range ia.GetQuestions()[0].GetOptions() {
		labels = append(labels, o.GetLabel())
	}
	require.Equal(t, []string{"red", "blue"}, labels, "single-select options kept")

	body := scrape(t, "http://"+metricsAddr+"/metrics")
	require.Contains(t, body, `tether_executor_runtime_questions_total{adapter="codex",outcome="normalized"} 1`)
	require.Contains(t, body, `tether_executor_runtime_questions_total{adapter="codex",outcome="provider_loss_handoff"} 1`)
	require.NotContains(t, body, "which color", "no request content in metrics")

}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}
