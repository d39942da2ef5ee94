package web_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/web"
)

type stubExecutor struct {
	executorv1.UnimplementedExecutorServiceServer
}

type stubRegistry struct {
	executorv1.UnimplementedGatewayRegistryServer
}

type stubCompanies struct {
	executorv1.UnimplementedCompaniesServer
}

// TestU3_HandlerServesOnlyThePublicServices: the public services answer
// in the Connect JSON form (here a stub's Unimplemented, as a Connect
// error); other services of the gRPC server are not served over HTTP.
func TestU3_HandlerServesOnlyThePublicServices(t *testing.T) {
	t.Parallel()
	gs := grpc.NewServer()
	executorv1.RegisterExecutorServiceServer(gs, stubExecutor{})
	executorv1.RegisterGatewayRegistryServer(gs, stubRegistry{})
	executorv1.RegisterCompaniesServer(gs, stubCompanies{})
	healthgrpc.RegisterHealthServer(gs, health.NewServer())
	h, err := web.Handler(gs)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/tether.executor.v1.ExecutorService/GetRun", "application/json", strings.NewReader(`{"runId":"x"}`))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusNotImplemented, resp.StatusCode, "%s", b)
	require.Contains(t, string(b), `"code":"unimplemented"`, "a Connect error from the gRPC handler")

	// Registered on the gRPC server, but not public: not served here.
	resp, err = http.Post(srv.URL+"/grpc.health.v1.Health/Check", "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// TestU4_TheConsoleIsEmbeddedAndLoadsNothingFromElsewhere: the console's
// files are served from the binary under a policy that allows only its
// own origin, / leads to it, and no file names another origin (no CDN,
// no external font).
func TestU4_TheConsoleIsEmbeddedAndLoadsNothingFromElsewhere(t *testing.T) {
	t.Parallel()
	gs := grpc.NewServer()
	executorv1.RegisterExecutorServiceServer(gs, stubExecutor{})
	executorv1.RegisterGatewayRegistryServer(gs, stubRegistry{})
	executorv1.RegisterCompaniesServer(gs, stubCompanies{})
	h, err := web.Handler(gs)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(srv.URL + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusFound, resp.StatusCode)
	require.Equal(t, "/console/", resp.Header.Get("Location"))
	for _, f := range []string{"", "app.js", "style.css"} {
		resp, err := http.Get(srv.URL + "/console/" + f)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, f)
		require.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'", f)
		require.Contains(t, resp.Header.Get("Content-Security-Policy"), "connect-src 'self'", f)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), f)
		require.NotRegexp(t, `(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/`, string(b), "%s names another origin", f)
	}
}
