package e2e

import (
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/tenancy"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// TestT2_OnAStackWithTokensAnotherCompanyCannotTouchALiveRun re-runs the
// issue's probes against real processes with tenancy enforced (the stack
// of make up-auth): while acme's turn is live, globex's writer cannot
// read, watch, steer, cancel or resolve it (each answers as a missing
// run), nor read or close acme's session, nor list acme's runs; a caller
// without a token is Unauthenticated; acme's writer asking another replica
// is forwarded with its token. The genuine run then succeeds once,
// unsteered, and the audit is clean.
func TestT2_OnAStackWithTokensAnotherCompanyCannotTouchALiveRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := newHarness(t, stack.Options{Auth: true, FakeArgs: []string{"--die-once-dir", dir}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	as := func(subject string, grants ...string) executorv1.ExecutorServiceClient {
		tok, err := h.st.Token(subject, time.Hour, grants...)
		require.NoError(t, err)
		conn, err := grpcx.Dial(h.st.Addr("executor"), "", grpc.WithPerRPCCredentials(tenancy.Bearer(tok)))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return executorv1.NewExecutorServiceClient(conn)
	}
	_, err := h.client.ListRuns(ctx, &executorv1.ListRunsRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "no token: %v", err)

	acme, globex := as("alice", "acme:writer"), as("mallory", "globex:writer")
	h.client = acme
	h.submit("victim", "victim", stalledTurn)
	h.waitForDelta(ctx, acme, "victim")

	notFound := map[string]error{}
	_, notFound["GetRun"] = globex.GetRun(ctx, &executorv1.GetRunRequest{RunId: "victim"})
	_, notFound["GetSteeringState"] = globex.GetSteeringState(ctx, &executorv1.GetSteeringStateRequest{RunId: "victim"})
	_, notFound["SteerRun"] = globex.SteerRun(ctx, &executorv1.SteerRunRequest{RunId: "victim", Message: "attacker steering text"})
	_, notFound["CancelRun"] = globex.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: "victim", Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN})
	res, _ := structpb.NewStruct(map[string]any{"decision": "accept"})
	_, notFound["ResolveRuntimeRequest"] = globex.ResolveRuntimeRequest(ctx, &executorv1.ResolveRuntimeRequestRequest{RunId: "victim", RequestId: "0", TurnId: "t", Resolution: res})
	if w, err := globex.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: "victim"}); err != nil {
		notFound["WatchRun"] = err
	} else {
		_, notFound["WatchRun"] = w.Recv()
	}
	for name, err := range notFound {
		require.Equal(t, codes.NotFound, status.Code(err), "%s: %v", name, err)
		require.EqualValues(t, failure.RunNotFound, failure.CodeOf(err), name)
	}
	_, err = globex.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: "victim"})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	_, err = globex.CloseSession(ctx, &executorv1.CloseSessionRequest{CompanyId: "acme", NormalizedSessionId: "victim"})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	list, err := globex.ListRuns(ctx, &executorv1.ListRunsRequest{})
	require.NoError(t, err)
	require.Empty(t, list.GetRuns())

	// Through another replica, the call is forwarded to the one driving
	// the run with the caller's token, and authorized there again.
	require.NoError(t, h.st.AddExecutor("executor-2"))
	_, err = h.st.Start(ctx, "executor-2")
	require.NoError(t, err)
	tok, err := h.st.Token("alice", time.Hour, "acme:writer")
	require.NoError(t, err)
	conn, err := grpcx.Dial(h.st.Addr("executor-2"), "", grpc.WithPerRPCCredentials(tenancy.Bearer(tok)))
	require.NoError(t, err)
	defer conn.Close()
	state, err := executorv1.NewExecutorServiceClient(conn).GetSteeringState(ctx, &executorv1.GetSteeringStateRequest{RunId: "victim"})
	require.NoError(t, err)
	require.Equal(t, "available", state.GetDisposition(), "forwarded to the driving replica with the caller's identity")

	releaseStall(t, dir, "mid-stream")
	waitSucceeded(ctx, t, acme, "victim")
	run, err := acme.GetRun(ctx, &executorv1.GetRunRequest{RunId: "victim"})
	require.NoError(t, err)
	require.NotContains(t, run.GetRun().GetResult().GetFinalMessage(), "attacker")
	require.Equal(t, 0, countLines(t, h.st.CallLog(), "turn/steer"), "the provider was never steered")
	require.Equal(t, 1, countLines(t, h.st.CallLog(), "turn/start"))
	rep, code := auditStack(t, h.dsn)
	require.Equal(t, 0, code, "%+v", rep.Violations)
	require.True(t, rep.Clean())
}

// TestT1_TheExecutorRefusesToStartOffLoopbackWithoutAuthentication runs
// the executor binary listening on every interface without -auth-jwks or
// -tls-client-ca: it exits at once, saying what to configure, before
// touching its database.
func TestT1_TheExecutorRefusesToStartOffLoopbackWithoutAuthentication(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "executor"), "-grpc-addr", "0.0.0.0:0", "-metrics-addr", "",
		"-insecure-allow-plaintext", "-database-url", "postgres://127.0.0.1:1/none", "-grant-key-file", filepath.Join(t.TempDir(), "none"))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, 1, exit.ExitCode(), "%s", out)
	require.Contains(t, string(out), "requires caller identities", "%s", out)
	require.Contains(t, string(out), "-auth-jwks")
}

// TestT2_TwoCompaniesRunTheSameRunIDThroughTheStackEachExactlyOnce: run
// ids are unique per company. On the stack with tokens (real executor,
// runnergw and runnerd processes), acme and globex each submit run id
// "same-id": both are created and run through the real gateway and
// runner, each exactly once (one provider turn each), each company sees
// its own run and events under that id (and its session's last run), an
// operator must name the company, and tetherctl audit is clean.
func TestT2_TwoCompaniesRunTheSameRunIDThroughTheStackEachExactlyOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, stack.Options{Auth: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	as := func(subject string, grants ...string) executorv1.ExecutorServiceClient {
		tok, err := h.st.Token(subject, time.Hour, grants...)
		require.NoError(t, err)
		conn, err := grpcx.Dial(h.st.Addr("executor"), "", grpc.WithPerRPCCredentials(tenancy.Bearer(tok)))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return executorv1.NewExecutorServiceClient(conn)
	}
	clients := map[string]executorv1.ExecutorServiceClient{"acme": as("alice", "acme:writer"), "globex": as("gwen", "globex:writer")}
	for _, company := range []string{"acme", "globex"} {
		in, err := cli.InputSpec{Prompt: company + "'s work", Company: company, Agent: "agent-1", Issue: "ISS-1",
			Session: "s-same-" + company, Lifecycle: "warm"}.Input()
		require.NoError(t, err)
		resp, err := clients[company].SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "same-id", Input: in})
		require.NoError(t, err, company)
		require.True(t, resp.GetCreated(), company)
		require.Equal(t, "same-id", resp.GetRun().GetRunId())
	}
	for company, c := range clients {
		waitSucceeded(ctx, t, c, "same-id")
		run, err := c.GetRun(ctx, &executorv1.GetRunRequest{RunId: "same-id"})
		require.NoError(t, err)
		require.Equal(t, company, run.GetRun().GetInput().GetBinding().GetCompanyId())
		require.Equal(t, company+"'s work", run.GetRun().GetInput().GetTask().GetPrompt())
		w, err := c.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: "same-id"})
		require.NoError(t, err)
		n := 0
		for {
			m, err := w.Recv()
			if err != nil {
				require.ErrorIs(t, err, io.EOF)
				break
			}
			n++
			require.Equal(t, "same-id", m.GetEvent().GetRunId(), "%s's events name its run by its id", company)
		}
		require.NotZero(t, n)
		sess, err := c.GetSession(ctx, &executorv1.GetSessionRequest{CompanyId: company, NormalizedSessionId: "s-same-" + company})
		require.NoError(t, err)
		require.Len(t, sess.GetSessions(), 1)
		require.Equal(t, "same-id", sess.GetSessions()[0].GetLastRunId())
		list, err := c.ListRuns(ctx, &executorv1.ListRunsRequest{})
		require.NoError(t, err)
		require.Len(t, list.GetRuns(), 1, company)
	}
	require.Equal(t, 2, countLines(t, h.st.CallLog(), "turn/start"), "each run's turn started exactly once")

	operator := as("olga", "operator")
	_, err := operator.GetRun(ctx, &executorv1.GetRunRequest{RunId: "same-id"})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.EqualValues(t, failure.RunIDAmbiguous, failure.CodeOf(err))
	run, err := operator.GetRun(ctx, &executorv1.GetRunRequest{RunId: "same-id", CompanyId: "globex"})
	require.NoError(t, err)
	require.Equal(t, "globex", run.GetRun().GetInput().GetBinding().GetCompanyId())

	rep, code := auditStack(t, h.dsn)
	require.Equal(t, 0, code, "%+v", rep.Violations)
	require.True(t, rep.Clean())
}
