package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tether-run/tether/pkg/testing/pgtest"
)

// cuttableProxy forwards TCP connections to target until cut, which closes
// every connection and refuses new ones until restore.
type cuttableProxy struct {
	target string
	lis    net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
}

func newCuttableProxy(t *testing.T, target string) *cuttableProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cuttableProxy{target: target, lis: lis}
	t.Cleanup(func() { lis.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *cuttableProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// TestD5_TheExecutorIsReadyOnlyWhileItsDatabaseAnswers: an executor whose
// database becomes unreachable reports NOT_SERVING (gRPC health) and /readyz
// 503 naming the database, while /healthz (liveness) stays ok — a restart
// would not help; when the database answers again it is SERVING again.
func TestD5_TheExecutorIsReadyOnlyWhileItsDatabaseAnswers(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t, stackSchema)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	proxy := newCuttableProxy(t, u.Host)
	u.Host = proxy.lis.Addr().String()

	pki := t.TempDir()
	out, err := exec.Command(filepath.Join(binDir, "tetherctl"), "certs", "init", pki).CombinedOutput()
	require.NoError(t, err, "%s", out)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "executor"), "-grpc-addr", "127.0.0.1:0", "-metrics-addr", "127.0.0.1:0",
		"-database-url", u.String(), "-migrate=false", "-grant-key-file", filepath.Join(pki, "grant.key"), "-gateway-addr", "127.0.0.1:1",
		"-registration-secret-file", filepath.Join(dir, "registration.secret"), "-secrets-key-file", filepath.Join(dir, "secrets.key"))
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer func() { cancel(); _ = cmd.Wait() }()

	var grpcAddr, metricsAddr string
	require.Eventually(t, func() bool {
		for _, line := range strings.Split(stderr.String(), "\n") {
			var rec struct {
				Msg     string `json:"msg"`
				GRPC    string `json:"grpc_addr"`
				Metrics string `json:"metrics_addr"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "serving" {
				grpcAddr, metricsAddr = rec.GRPC, rec.Metrics
				return true
			}
		}
		return false
	}, time.Minute, 20*time.Millisecond, "the executor never served: %s", &stderr)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	status := func() healthpb.HealthCheckResponse_ServingStatus {
		res, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return res.GetStatus()
	}
	get := func(path string) (int, string) {
		res, err := http.Get("http://" + metricsAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, status())

	proxy.setCut(true)
	require.Eventually(t, func() bool { return status() == healthpb.HealthCheckResponse_NOT_SERVING }, 30*time.Second, 50*time.Millisecond)
	code, body := get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "database")
	code, _ = get("/healthz")
	require.Equal(t, http.StatusOK, code, "unready, not dead")

	proxy.setCut(false)
	require.Eventually(t, func() bool { return status() == healthpb.HealthCheckResponse_SERVING }, 30*time.Second, 50*time.Millisecond)
	code, _ = get("/readyz")
	require.Equal(t, http.StatusOK, code)
}
