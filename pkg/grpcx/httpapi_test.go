package grpcx

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestU3_TheHTTPPortFollowsTheGRPCPortsRules: an HTTP listener off
// loopback in plaintext is refused as gRPC's is; on loopback it serves
// beside gRPC, and a call in flight when shutdown begins completes before
// the server stops.
func TestU3_TheHTTPPortFollowsTheGRPCPortsRules(t *testing.T) {
	t.Parallel()
	quiet := NewLogger("error", "text", io.Discard)
	srv, err := New(Config{GRPCAddr: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddHTTP("0.0.0.0:0", http.NotFoundHandler()); err == nil || !strings.Contains(err.Error(), "plaintext HTTP") {
		t.Fatalf("AddHTTP off loopback in plaintext = %v, want refused", err)
	}

	started, release := make(chan struct{}), make(chan struct{})
	if err := srv.AddHTTP("127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		io.WriteString(w, "done") //nolint:errcheck
	})); err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	got := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + srv.HTTPAddr().String() + "/")
		if err != nil {
			got <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- string(b)
	}()
	<-started
	cancel()
	select {
	case err := <-served:
		t.Fatalf("Serve returned %v with an HTTP call in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if b := <-got; b != "done" {
		t.Fatalf("in-flight HTTP call = %q, want done", b)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
}
