package api_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/api"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/secrets"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/watch"
)

func TestMain(m *testing.M) { pgtest.MainCheckingLeaks(m) }

type env struct {
	client executorv1.ExecutorServiceClient
	store  *store.Store
	hub    *watch.Hub
	reads  *countingReader // the hub's event reads
	addr   string
	vault  *secrets.Vault
}

func start(t *testing.T, opts ...watch.Option) env {
	t.Helper()
	dsn := pgtest.NewDB(t, pgtest.GooseMigrator(store.Migrations, "migrations", goose.WithTableName("executor_goose_version")))
	ctx, cancel := context.WithCancel(context.Background())
	st, err := store.Open(ctx, dsn, runrules.New())
	require.NoError(t, err)
	reads := &countingReader{Reader: st, n: map[string]int{}}
	// As the executor binary builds them: events encoded once per feed.
	hub := watch.NewHub(reads, append([]watch.Option{watch.WithEncoder(api.EncodeWatchEvent)}, opts...)...)
	srv, err := grpcx.New(grpcx.Config{Name: "executor", GRPCAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, api.WatchCodec())
	require.NoError(t, err)
	keys, err := secrets.New(make([]byte, 32))
	require.NoError(t, err)
	vault := &secrets.Vault{Keys: keys, Store: st}
	executorv1.RegisterExecutorServiceServer(srv.GRPC(), &api.Server{Store: st, Hub: hub, Vault: vault})
	require.NoError(t, srv.Listen())
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ctx) }()
	listened := make(chan struct{})
	go func() {
		defer close(listened)
		hub.Listen(ctx, st.Pool(), watch.Handlers{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	conn, err := grpcx.Dial(srv.Addr().String(), "")
	require.NoError(t, err)
	t.Cleanup(func() {
		conn.Close()
		cancel()
		<-served
		<-listened
		st.Close()
	})
	return env{client: executorv1.NewExecutorServiceClient(conn), store: st, hub: hub, reads: reads, addr: srv.Addr().String(), vault: vault}
}

func validInput() *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"},
		Binding:  &prpv1.Binding{CompanyId: "acme", AgentId: "agent-1"},
		Task:     &prpv1.Task{Prompt: "hello"},
		Session: &prpv1.Session{NormalizedSessionId: "s1",
			Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
}

func TestSubmitRunBadInputIsInvalidArgumentNamingFieldsAndWritesNothing(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()
	cases := map[string]struct {
		req    *executorv1.SubmitRunRequest
		fields []string
	}{
		"missing everything": {&executorv1.SubmitRunRequest{}, []string{"run_id", "input"}},
		"malformed run id":   {&executorv1.SubmitRunRequest{RunId: "../etc", Input: validInput()}, []string{"run_id"}},
		"missing prompt and session": {&executorv1.SubmitRunRequest{RunId: "r1", Input: func() *prpv1.ExecutionInput {
			in := validInput()
			in.Task.Prompt = ""
			in.Session = nil
			return in
		}()}, []string{"input.task.prompt", "input.session"}},
		"unknown provider and relative cwd": {&executorv1.SubmitRunRequest{RunId: "r2", Input: func() *prpv1.ExecutionInput {
			in := validInput()
			in.Provider.Kind = "gpt-shell"
			in.Workspace = &prpv1.Workspace{Cwd: "relative/dir"}
			return in
		}()}, []string{"input.provider.kind", "input.workspace.cwd"}},
		"no lifecycle mode": {&executorv1.SubmitRunRequest{RunId: "r3", Input: func() *prpv1.ExecutionInput {
			in := validInput()
			in.Session.Lifecycle.Mode = prpv1.LifecycleMode_LIFECYCLE_MODE_UNSPECIFIED
			return in
		}()}, []string{"input.session.lifecycle.mode"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := e.client.SubmitRun(ctx, c.req)
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			for _, f := range c.fields {
				require.Contains(t, status.Convert(err).Message(), f)
			}
		})
	}
	// A provider that is not qualified (opencode needs provider/model) is refused by code.
	in := validInput()
	in.Provider.Kind = "opencode"
	_, err := e.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "r4", Input: in})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.EqualValues(t, "provider_not_admitted", failure.CodeOf(err))

	list, err := e.client.ListRuns(ctx, &executorv1.ListRunsRequest{})
	require.NoError(t, err)
	require.Empty(t, list.GetRuns(), "bad input must write nothing")
}

func TestSubmitRunTwiceYieldsOneRun(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx := context.Background()
	req := &executorv1.SubmitRunRequest{RunId: "run-1", Input: validInput()}
	a, err := e.client.SubmitRun(ctx, req)
	require.NoError(t, err)
	require.True(t, a.GetCreated())
	b, err := e.client.SubmitRun(ctx, req)
	require.NoError(t, err)
	require.False(t, b.GetCreated())
	require.True(t, proto.Equal(a.GetRun(), b.GetRun()))
	other := proto.Clone(req).(*executorv1.SubmitRunRequest)
	other.Input.Task.Prompt = "different"
	_, err = e.client.SubmitRun(ctx, other)
	require.Equal(t, codes.AlreadyExists, status.Code(err))
	require.EqualValues(t, "run_id_conflict", failure.CodeOf(err))
	_, err = e.client.GetRun(ctx, &executorv1.GetRunRequest{RunId: "nope"})
	require.Equal(t, codes.NotFound, status.Code(err))
	require.EqualValues(t, "run_not_found", failure.CodeOf(err))
}

func ev(run string, seq uint64, typ string) *prpv1.Event {
	p, _ := structpb.NewStruct(map[string]any{"runTerminalState": "succeeded", "turnTerminalState": "completed"})
	return &prpv1.Event{SourceInstanceId: "runner-1", SourceEventId: typ + string(rune('a'+seq)), SourceSeq: seq,
		RunId: run, EventType: typ, Payload: p}
}

func TestWatchRunStreamsLiveThenReplaysTheSameSequence(t *testing.T) {
	t.Parallel()
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := e.client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "w", Input: validInput()})
	require.NoError(t, err)
	claim, err := e.store.ClaimNext(ctx, "o", time.Minute, store.Controller{})
	require.NoError(t, err)

	_, err = e.client.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: "w", AfterSeq: 1}) // stream opens lazily
	require.NoError(t, err)
	live, err := e.client.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: "w"})
	require.NoError(t, err)
	got := make(chan []*executorv1.WatchRunResponse, 1)
	go func() {
		var out []*executorv1.WatchRunResponse
		for {
			m, err := live.Recv()
			if err != nil {
				got <- out
				return
			}
			out = append(out, m)
		}
	}()
	types := []string{"session.started", "turn.started", "item.delta", "turn.completed", "run.terminal"}
	for i, typ := range types {
		_, err := e.store.AppendEvents(ctx, claim.Fence, []*prpv1.Event{ev("w", uint64(i+1), typ)})
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
	}
	liveSeq := <-got
	require.Len(t, liveSeq, len(types))

	replay, err := e.client.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: "w"})
	require.NoError(t, err)
	var again []*executorv1.WatchRunResponse
	for {
		m, err := replay.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		again = append(again, m)
	}
	require.Len(t, again, len(liveSeq))
	for i := range again {
		require.True(t, proto.Equal(liveSeq[i], again[i]), "event %d differs", i)
	}
	// From the end cursor the watch ends at once; beyond it is OutOfRange.
	tail, err := e.client.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: "w", AfterSeq: 5})
	require.NoError(t, err)
	_, err = tail.Recv()
	require.Equal(t, io.EOF, err)
	beyond, err := e.client.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: "w", AfterSeq: 6})
	require.NoError(t, err)
	_, err = beyond.Recv()
	require.Equal(t, codes.OutOfRange, status.Code(err))
	require.EqualValues(t, "watch_cursor_out_of_range", failure.CodeOf(err))
}
