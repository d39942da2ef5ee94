package grpcx

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/buildinfo"
	"github.com/tether-run/tether/pkg/envflag"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// verifier is a tiny BackupVerifier: lease "panic" panics, lease "block"
// waits for release.
type verifier struct {
	backupv1.UnimplementedBackupVerifierServer
	blocked chan struct{}
	release chan struct{}
}

func (v *verifier) VerifyStamp(ctx context.Context, req *backupv1.VerifyStampRequest) (*backupv1.VerifyStampResponse, error) {
	switch req.GetLeaseId() {
	case "panic":
		panic("boom")
	case "block":
		v.blocked <- struct{}{}
		select {
		case <-v.release:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return &backupv1.VerifyStampResponse{Valid: req.GetStamp().GetLeaseId() == req.GetLeaseId()}, nil
}

type executor struct {
	executorv1.UnimplementedExecutorServiceServer
}

func (executor) GetRun(_ context.Context, req *executorv1.GetRunRequest) (*executorv1.GetRunResponse, error) {
	return &executorv1.GetRunResponse{Run: &executorv1.Run{RunId: req.GetRunId(), Attempt: 3}}, nil
}

// WatchRun sends after_seq+1; with run_id "unwrapped" it sends after_seq+2
// on the unwrapped stream too.
func (executor) WatchRun(req *executorv1.WatchRunRequest, stream grpc.ServerStreamingServer[executorv1.WatchRunResponse]) error {
	if err := stream.Send(&executorv1.WatchRunResponse{Seq: req.GetAfterSeq() + 1}); err != nil {
		return err
	}
	if req.GetRunId() != "unwrapped" {
		return nil
	}
	return Unwrapped(stream).SendMsg(&executorv1.WatchRunResponse{Seq: req.GetAfterSeq() + 2})
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type harness struct {
	srv    *Server
	v      *verifier
	conn   *grpc.ClientConn
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan error
}

func startServer(t *testing.T, mutate func(*Config)) *harness {
	t.Helper()
	logs := &syncBuffer{}
	cfg := Config{
		Name:            "test",
		GRPCAddr:        "127.0.0.1:0",
		MetricsAddr:     "127.0.0.1:0",
		ShutdownTimeout: 5 * time.Second,
		Logger:          NewLogger("debug", "json", logs),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v := &verifier{blocked: make(chan struct{}, 1), release: make(chan struct{})}
	backupv1.RegisterBackupVerifierServer(srv.GRPC(), v)
	executorv1.RegisterExecutorServiceServer(srv.GRPC(), executor{})
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{srv: srv, v: v, logs: logs, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- srv.Serve(ctx) }()
	if cfg.TLSCertFile == "" {
		conn, err := Dial(srv.Addr().String(), "")
		if err != nil {
			t.Fatal(err)
		}
		h.conn = conn
	}
	t.Cleanup(func() {
		if h.conn != nil {
			h.conn.Close()
		}
		h.stop(t)
	})
	return h
}

func (h *harness) stop(t *testing.T) {
	t.Helper()
	h.cancel()
	if err := h.wait(t); err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// wait returns Serve's result (once; later calls return nil).
func (h *harness) wait(t *testing.T) error {
	t.Helper()
	select {
	case err, ok := <-h.done:
		if ok {
			close(h.done)
		}
		return err
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return")
		return nil
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func validRequest(lease string) *backupv1.VerifyStampRequest {
	return &backupv1.VerifyStampRequest{Stamp: &backupv1.Stamp{LeaseId: lease}, LeaseId: lease}
}

func TestHealthServingThenNotServingOnShutdown(t *testing.T) {
	h := startServer(t, func(c *Config) { c.DrainDelay = 300 * time.Millisecond })
	ctx := ctxT(t)
	hc := healthpb.NewHealthClient(h.conn)
	for _, svc := range []string{"", "tether.backup.v1.BackupVerifier", "tether.executor.v1.ExecutorService"} {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check(%q) = %v, %v; want SERVING", svc, resp, err)
		}
	}
	watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := watch.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch first = %v, %v", m, err)
	}

	// An RPC in flight when shutdown starts completes.
	inflight := make(chan error, 1)
	go func() {
		_, err := backupv1.NewBackupVerifierClient(h.conn).VerifyStamp(ctx, validRequest("block"))
		inflight <- err
	}()
	<-h.v.blocked

	h.cancel()
	if m, err := watch.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch after shutdown = %v, %v; want NOT_SERVING", m, err)
	}
	// The watch stream is ended so it does not hold up GracefulStop.
	if _, err := watch.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("Watch end = %v; want Unavailable", err)
	}
	// During the drain delay, Check still answers: NOT_SERVING.
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Check during drain = %v, %v; want NOT_SERVING", resp, err)
	}
	select {
	case <-h.srv.Draining():
	default:
		t.Fatal("Draining not closed")
	}
	close(h.v.release)
	if err := <-inflight; err != nil {
		t.Fatalf("in-flight RPC: %v", err)
	}
	if err := h.wait(t); err != nil {
		t.Fatalf("Serve = %v, want nil", err)
	}
}

func TestShutdownTimeoutCancelsStuckRPC(t *testing.T) {
	h := startServer(t, func(c *Config) { c.ShutdownTimeout = 200 * time.Millisecond })
	ctx := ctxT(t)
	inflight := make(chan error, 1)
	go func() {
		_, err := backupv1.NewBackupVerifierClient(h.conn).VerifyStamp(ctx, validRequest("block"))
		inflight <- err
	}()
	<-h.v.blocked
	start := time.Now()
	h.cancel()
	if err := h.wait(t); err != nil {
		t.Fatalf("Serve = %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("shutdown took %v", d)
	}
	if err := <-inflight; status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
		t.Fatalf("stuck RPC ended with %v", err)
	}
	close(h.v.release)
}

func listServices(t *testing.T, conn *grpc.ClientConn, v1 bool) []string {
	t.Helper()
	ctx := ctxT(t)
	var names []string
	if v1 {
		stream, err := reflectionv1.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		stream.CloseSend()
		return names
	}
	stream, err := reflectionv1alpha.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	stream.CloseSend()
	return names
}

func TestReflectionListsServices(t *testing.T) {
	h := startServer(t, nil)
	for _, v1 := range []bool{true, false} {
		names := listServices(t, h.conn, v1)
		for _, want := range []string{"tether.backup.v1.BackupVerifier", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
			if !slices.Contains(names, want) {
				t.Errorf("v1=%v: services %v lack %s", v1, names, want)
			}
		}
	}
	// File descriptors resolve too (what grpcurl describe needs).
	ctx := ctxT(t)
	stream, err := reflectionv1.NewServerReflectionClient(h.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.CloseSend()
	if err := stream.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "tether.backup.v1.BackupVerifier"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil || len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("FileContainingSymbol = %v, %v", resp, err)
	}
}

func TestProtovalidateRejectsBadRequest(t *testing.T) {
	h := startServer(t, nil)
	c := backupv1.NewBackupVerifierClient(h.conn)
	_, err := c.VerifyStamp(ctxT(t), &backupv1.VerifyStampRequest{Stamp: &backupv1.Stamp{}, LeaseId: ""})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "lease_id") {
		t.Fatalf("err = %v; want InvalidArgument naming lease_id", err)
	}
	_, err = c.VerifyStamp(ctxT(t), &backupv1.VerifyStampRequest{LeaseId: "x"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "stamp") {
		t.Fatalf("err = %v; want InvalidArgument naming stamp", err)
	}
	resp, err := c.VerifyStamp(ctxT(t), validRequest("lease-1"))
	if err != nil || !resp.GetValid() {
		t.Fatalf("valid request: %v, %v", resp, err)
	}
}

func TestPanicBecomesInternal(t *testing.T) {
	h := startServer(t, nil)
	c := backupv1.NewBackupVerifierClient(h.conn)
	_, err := c.VerifyStamp(ctxT(t), validRequest("panic"))
	if status.Code(err) != codes.Internal {
		t.Fatalf("err = %v; want Internal", err)
	}
	if strings.Contains(err.Error(), "boom") {
		t.Errorf("panic value leaked to the client: %v", err)
	}
	if _, err := c.VerifyStamp(ctxT(t), validRequest("after")); err != nil {
		t.Fatalf("server did not survive the panic: %v", err)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "panic in gRPC handler") || !strings.Contains(logs, "boom") || !strings.Contains(logs, "grpcx_test.go") {
		t.Errorf("panic not logged with stack:\n%s", logs)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestMetricsEndpoint(t *testing.T) {
	h := startServer(t, nil)
	c := backupv1.NewBackupVerifierClient(h.conn)
	for range 3 {
		if _, err := c.VerifyStamp(ctxT(t), validRequest("l")); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = c.VerifyStamp(ctxT(t), &backupv1.VerifyStampRequest{})
	base := "http://" + h.srv.MetricsAddr().String()
	code, body := httpGet(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{
		`grpc_server_started_total{grpc_method="VerifyStamp",grpc_service="tether.backup.v1.BackupVerifier",grpc_type="unary"} 4`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="VerifyStamp",grpc_service="tether.backup.v1.BackupVerifier",grpc_type="unary"} 3`,
		`grpc_server_handled_total{grpc_code="InvalidArgument",grpc_method="VerifyStamp",grpc_service="tether.backup.v1.BackupVerifier",grpc_type="unary"} 1`,
		`grpc_server_msg_received_total{grpc_method="VerifyStamp",grpc_service="tether.backup.v1.BackupVerifier",grpc_type="unary"} 4`,
		`grpc_server_handling_seconds_count{grpc_method="VerifyStamp",grpc_service="tether.backup.v1.BackupVerifier",grpc_type="unary"} 4`,
		// Pre-initialised series for methods not called yet.
		`grpc_server_started_total{grpc_method="WatchRun",grpc_service="tether.executor.v1.ExecutorService",grpc_type="server_stream"} 0`,
		"go_goroutines",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if code, body := httpGet(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, _ := httpGet(t, base+"/readyz"); code != 200 {
		t.Errorf("/readyz = %d", code)
	}
}

func TestUnwrappedStreamSendsWithoutTheMessageHooksAndTheCallIsStillCounted(t *testing.T) {
	h := startServer(t, nil)
	stream, err := executorv1.NewExecutorServiceClient(h.conn).WatchRun(ctxT(t), &executorv1.WatchRunRequest{RunId: "unwrapped", AfterSeq: 4})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, m.GetSeq())
	}
	if !slices.Equal(seqs, []uint64{5, 6}) {
		t.Fatalf("received seqs %v, want [5 6]", seqs)
	}
	// The call is counted once it is handled (after the client saw its end).
	base := "http://" + h.srv.MetricsAddr().String()
	series := `{grpc_method="WatchRun",grpc_service="tether.executor.v1.ExecutorService",grpc_type="server_stream"}`
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, body := httpGet(t, base+"/metrics")
		if strings.Contains(body, `grpc_server_handled_total{grpc_code="OK",grpc_method="WatchRun"`) {
			// Only the wrapped stream's message went through the hooks.
			if !strings.Contains(body, "grpc_server_msg_sent_total"+series+" 1\n") ||
				!strings.Contains(body, "grpc_server_started_total"+series+" 1\n") {
				t.Fatalf("WatchRun series:\n%s", grepLines(body, "WatchRun"))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("WatchRun never counted as handled:\n%s", grepLines(body, "WatchRun"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestPprofOnlyWhenAsked(t *testing.T) {
	off := startServer(t, nil)
	if code, _ := httpGet(t, "http://"+off.srv.MetricsAddr().String()+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("without -pprof: /debug/pprof/ = %d, want 404", code)
	}
	on := startServer(t, func(c *Config) { c.Pprof = true })
	if code, body := httpGet(t, "http://"+on.srv.MetricsAddr().String()+"/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("with -pprof: /debug/pprof/ = %d", code)
	}
}

func TestLogFieldsRunIDAndAttempt(t *testing.T) {
	h := startServer(t, nil)
	c := executorv1.NewExecutorServiceClient(h.conn)
	if _, err := c.GetRun(ctxT(t), &executorv1.GetRunRequest{RunId: "run-unary"}); err != nil {
		t.Fatal(err)
	}
	stream, err := c.WatchRun(ctxT(t), &executorv1.WatchRunRequest{RunId: "run-stream"})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	// The server logs "finished call" after the client saw the end; wait.
	deadline := time.Now().Add(5 * time.Second)
	for {
		found := map[string]bool{}
		for _, line := range strings.Split(h.logs.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != "finished call" {
				continue
			}
			if id, ok := rec["run_id"].(string); ok {
				found[id] = true
				if rec["service"] != "test" || rec["grpc.code"] != "OK" {
					t.Errorf("log line %s", line)
				}
			}
		}
		if found["run-unary"] && found["run-stream"] {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("finished-call lines with run_id: %v\n%s", found, h.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestExtractIDs(t *testing.T) {
	req := &gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: &gatewayv1.Open{
		RunId: "r1",
		Fence: &gatewayv1.FencingToken{Owner: "me", Attempt: 7},
	}}}
	run, att, ok, _ := extractIDs(req)
	if run != "r1" || att != 7 || !ok {
		t.Fatalf("AttachRequest: run=%q attempt=%d ok=%v", run, att, ok)
	}
	run, att, ok, _ = extractIDs(&executorv1.Run{RunId: "r2", Attempt: 2})
	if run != "r2" || att != 2 || !ok {
		t.Fatalf("Run: run=%q attempt=%d ok=%v", run, att, ok)
	}
	run, _, ok, _ = extractIDs(validRequest("x"))
	if run != "" || ok {
		t.Fatalf("VerifyStampRequest: run=%q ok=%v", run, ok)
	}
	_, _, _, sess := extractIDs(&executorv1.ListRunsRequest{NormalizedSessionId: "s1"})
	if sess != "s1" {
		t.Fatalf("session = %q", sess)
	}
}

func TestPlaintextRefusedOffLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "10.1.2.3:7000", "example.com:443"} {
		_, err := New(Config{GRPCAddr: addr})
		if err == nil || !strings.Contains(err.Error(), "insecure-allow-plaintext") {
			t.Errorf("New(%s) = %v; want refusal", addr, err)
		}
	}
	if _, err := New(Config{GRPCAddr: "0.0.0.0:0", AllowPlaintext: true}); err != nil {
		t.Errorf("with AllowPlaintext: %v", err)
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0"} {
		if _, err := New(Config{GRPCAddr: addr}); err != nil {
			t.Errorf("New(%s) = %v", addr, err)
		}
	}

	// ServeListener checks the real listener too.
	srv, err := New(Config{Logger: NewLogger("error", "text", io.Discard)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	err = srv.ServeListener(context.Background(), lis)
	if err == nil || !strings.Contains(err.Error(), "plaintext") {
		t.Fatalf("ServeListener on %s = %v; want refusal", lis.Addr(), err)
	}
	// The flag's env fallback enables it.
	t.Setenv("TETHER_INSECURE_ALLOW_PLAINTEXT", "true")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	cfg := RegisterFlags(fs, "x", "0.0.0.0:0", "")
	if err := envflag.Parse(fs, nil); err != nil {
		t.Fatal(err)
	}
	if !cfg.AllowPlaintext {
		t.Fatal("TETHER_INSECURE_ALLOW_PLAINTEXT ignored")
	}
	if _, err := New(*cfg); err != nil {
		t.Fatal(err)
	}
}

func TestFlagsWithEnvFallback(t *testing.T) {
	t.Setenv("TETHER_GRPC_ADDR", "127.0.0.1:9999")
	t.Setenv("TETHER_SHUTDOWN_TIMEOUT", "3s")
	t.Setenv("TETHER_LOG_FORMAT", "text")
	t.Setenv("TETHER_WIDGETS", "12")
	fs := flag.NewFlagSet("svc", flag.ContinueOnError)
	cfg := RegisterFlags(fs, "svc", "127.0.0.1:7000", "127.0.0.1:7001")
	widgets := envflag.Int(fs, "widgets", "", 1, "how many")
	name := envflag.String(fs, "name", "TETHER_CUSTOM_NAME", "def", "a name")
	on := envflag.Bool(fs, "on", "", false, "switch")
	wait := envflag.Duration(fs, "wait", "", time.Second, "wait")
	if err := envflag.Parse(fs, []string{"-metrics-addr", "127.0.0.1:1234", "-on"}); err != nil {
		t.Fatal(err)
	}
	if cfg.GRPCAddr != "127.0.0.1:9999" || cfg.MetricsAddr != "127.0.0.1:1234" ||
		cfg.ShutdownTimeout != 3*time.Second || cfg.LogFormat != "text" || cfg.LogLevel != "info" {
		t.Fatalf("cfg = %+v", cfg)
	}
	if *widgets != 12 || *name != "def" || !*on || *wait != time.Second {
		t.Fatalf("widgets=%d name=%q on=%v wait=%v", *widgets, *name, *on, *wait)
	}
	if got := fs.Lookup("grpc-addr").Usage; !strings.Contains(got, "TETHER_GRPC_ADDR") {
		t.Errorf("usage %q does not mention the env var", got)
	}

	// Flags beat env.
	fs2 := flag.NewFlagSet("svc", flag.ContinueOnError)
	cfg2 := RegisterFlags(fs2, "svc", "", "")
	if err := envflag.Parse(fs2, []string{"-grpc-addr", "127.0.0.1:1"}); err != nil || cfg2.GRPCAddr != "127.0.0.1:1" {
		t.Fatalf("flag override: %v %q", err, cfg2.GRPCAddr)
	}

	// Invalid env values are reported, by ParseFlags and by New.
	t.Setenv("TETHER_SHUTDOWN_TIMEOUT", "soon")
	fs3 := flag.NewFlagSet("svc", flag.ContinueOnError)
	cfg3 := RegisterFlags(fs3, "svc", "127.0.0.1:0", "")
	if err := envflag.Parse(fs3, nil); err == nil || !strings.Contains(err.Error(), "TETHER_SHUTDOWN_TIMEOUT") {
		t.Fatalf("ParseFlags = %v", err)
	}
	if _, err := New(*cfg3); err == nil || !strings.Contains(err.Error(), "TETHER_SHUTDOWN_TIMEOUT") {
		t.Fatalf("New = %v", err)
	}
}

func TestNewRejectsBadLogSettings(t *testing.T) {
	if _, err := New(Config{GRPCAddr: "127.0.0.1:0", LogLevel: "loud"}); err == nil {
		t.Error("bad level accepted")
	}
	if _, err := New(Config{GRPCAddr: "127.0.0.1:0", LogFormat: "xml"}); err == nil {
		t.Error("bad format accepted")
	}
}

func TestDialTargets(t *testing.T) {
	for target, want := range map[string]bool{
		"127.0.0.1:80":                 true,
		"localhost:80":                 true,
		"[::1]:80":                     true,
		"dns:///localhost:80":          true,
		"passthrough:///127.0.0.1:80":  true,
		"unix:///tmp/x.sock":           true,
		"executor:7400":                false,
		"dns:///executor.example:7400": false,
		"10.0.0.1:80":                  false,
	} {
		if got := isLoopbackTarget(target); got != want {
			t.Errorf("isLoopbackTarget(%q) = %v", target, got)
		}
	}
}

// TestTLSAndMTLS serves TLS with required client certificates on a
// non-loopback-capable setup and dials it with Dial + ClientTLSConfig.
func TestTLSAndMTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := makeCA(t, dir)
	makeLeaf(t, dir, "server", ca, caKey, true)
	makeLeaf(t, dir, "client", ca, caKey, false)
	h := startServer(t, func(c *Config) {
		c.GRPCAddr = "0.0.0.0:0" // off loopback: allowed because TLS is on
		c.TLSCertFile = filepath.Join(dir, "server.pem")
		c.TLSKeyFile = filepath.Join(dir, "server-key.pem")
		c.TLSClientCAFile = filepath.Join(dir, "ca.pem")
	})
	_, port, _ := net.SplitHostPort(h.srv.Addr().String())
	target := net.JoinHostPort("127.0.0.1", port)

	// Without a client certificate the handshake fails.
	noCert, err := Dial(target, filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	defer noCert.Close()
	if _, err := healthpb.NewHealthClient(noCert).Check(ctxT(t), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("without client cert: %v", err)
	}

	tc, err := ClientTLSConfig(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := Dial(target, "", grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("mTLS Check = %v, %v", resp, err)
	}
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func makeCA(t *testing.T, dir string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tether test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", der)
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}

func makeLeaf(t *testing.T, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, server bool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, name+"-key.pem"), "PRIVATE KEY", kb)
}

func TestHealthCallsLoggedAtDebug(t *testing.T) {
	logs := &syncBuffer{}
	h := startServer(t, func(c *Config) { c.Logger = NewLogger("info", "json", logs); c.AccessLog = AccessLogAll })
	if _, err := healthpb.NewHealthClient(h.conn).Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := backupv1.NewBackupVerifierClient(h.conn).VerifyStamp(ctxT(t), validRequest("x")); err != nil {
		t.Fatal(err)
	}
	h.stop(t)
	out := logs.String()
	if strings.Contains(out, "grpc.health.v1.Health") {
		t.Errorf("health check logged at info:\n%s", out)
	}
	if !strings.Contains(out, `"grpc.method":"VerifyStamp"`) {
		t.Errorf("service call not logged:\n%s", out)
	}
}

// TestL4_EveryServiceExposesItsBuildAndLogsItAtStart: /metrics carries
// tether_build_info{service, version, commit, go_version} 1 and the
// "serving" log line names the same build.
func TestL4_EveryServiceExposesItsBuildAndLogsItAtStart(t *testing.T) {
	h := startServer(t, nil)
	b := buildinfo.Read()
	_, body := httpGet(t, "http://"+h.srv.MetricsAddr().String()+"/metrics")
	want := fmt.Sprintf(`tether_build_info{commit=%q,go_version=%q,service=%q,version=%q} 1`, b.Commit, b.Go, "test", b.Version)
	if !strings.Contains(body, want) {
		t.Errorf("/metrics lacks %s", want)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, `"msg":"serving"`) || !strings.Contains(logs, `"version":"`+b.Version+`"`) || !strings.Contains(logs, `"commit":"`+b.Commit+`"`) {
		t.Errorf("the serving log line does not name the build:\n%s", logs)
	}
}
