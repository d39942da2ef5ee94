package runner

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/backoff"
	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/pkg/testing/prptest"
)

// runOneTurn drives run-1 through one turn over the gateway's connection.
func runOneTurn(t *testing.T, e *testEnv) {
	t.Helper()
	cs := &cmdSeq{t: t, runID: "run-1", attempt: 1}
	prov := attachAndTurn(t, e, cs)
	prov.finish(TurnResult{TurnID: "turn-1", Status: "completed", FinalMessage: "over tls"})
	term := e.gw.waitEvent("run.terminal", 1)
	assert.Equal(t, "over tls", term.GetPayload().AsMap()["finalMessage"])
}

func TestR6_DialWSSWithAPrivateCABundle(t *testing.T) {
	t.Parallel()
	ca := prptest.NewCA(t)
	leaf := ca.Issue(t, "gateway")
	e := newTestEnv(t)
	e.gw.close()
	e.gw = newFakeGatewayTLS(t, leaf.ServerConfig())
	require.True(t, strings.HasPrefix(e.gw.url(), "wss://"))

	// Without the CA bundle the gateway's certificate is not trusted: no
	// connection, the runner keeps retrying.
	p := e.start(nil)
	time.Sleep(300 * time.Millisecond)
	e.gw.mu.Lock()
	assert.Zero(t, e.gw.conns, "an untrusted gateway certificate is refused")
	e.gw.mu.Unlock()
	require.Equal(t, ExitOK, p.stop(t))

	p = e.start(func(c *Config) { c.CABundlePath = ca.CAFile(t) })
	e.gw.waitConns(1)
	runOneTurn(t, e)
	require.Equal(t, ExitOK, p.stop(t))
}

func TestR6_CABundleMustBePrivateAndOnlyWithWSS(t *testing.T) {
	t.Parallel()
	ca := prptest.NewCA(t)
	e := newTestEnv(t)
	open := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(open, ca.CertPEM, 0o666))
	require.NoError(t, os.Chmod(open, 0o666))
	_, err := Run(context.Background(), e.config(func(c *Config) {
		c.ConnectURL = "wss://127.0.0.1:1/v1/runners/connect"
		c.CABundlePath = open
	}))
	require.ErrorContains(t, err, "must not be writable by group or others")

	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))
	_, err = Run(context.Background(), e.config(func(c *Config) {
		c.ConnectURL = "wss://127.0.0.1:1/v1/runners/connect"
		c.CABundlePath = notPEM
	}))
	require.ErrorContains(t, err, "no PEM certificate")

	_, err = Run(context.Background(), e.config(func(c *Config) { c.CABundlePath = ca.CAFile(t) }))
	require.ErrorContains(t, err, "only valid with a wss://")

	_, err = Run(context.Background(), e.config(func(c *Config) {
		c.ListenAddress, c.ListenPort, c.ListenPath = "127.0.0.1", 1, ListenPath(tRunner)
	}))
	require.ErrorContains(t, err, "not both")
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestR6_ListenWSOverTLSServesTheGatewayDialingIn(t *testing.T) {
	t.Parallel()
	ca := prptest.NewCA(t)
	leaf := ca.Issue(t, "runner")
	e := newTestEnv(t)
	port := freePort(t)
	p := e.start(func(c *Config) {
		c.ConnectURL = ""
		c.ListenAddress, c.ListenPort, c.ListenPath = "127.0.0.1", port, ListenPath(tRunner)
		c.ListenTLSCert, c.ListenTLSKey = leaf.CertFile, leaf.KeyFile
	})
	base := fmt.Sprintf("wss://127.0.0.1:%d", port)
	clientTLS := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	url := base + ListenPath(tRunner)
	require.Eventually(t, func() bool {
		c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), clientTLS)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "runner listens")

	// Wrong path, a query, or an extension request is a plain 400.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}}
	hbase := fmt.Sprintf("https://127.0.0.1:%d", port)
	for _, u := range []string{hbase + "/v1/runners/connect/other", hbase + ListenPath(tRunner) + "?x=1"} {
		resp, err := hc.Get(u)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, u)
	}
	req, _ := http.NewRequest(http.MethodGet, hbase+ListenPath(tRunner), nil)
	req.Header.Set("Sec-WebSocket-Extensions", "permessage-deflate")
	resp, err := hc.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)

	// An impostor that refuses the runner's credential (without ever
	// proving itself) does not make the runner give up.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: hc})
	require.NoError(t, err)
	imp := prp.NewConn(ws)
	_, err = imp.Read(ctx) // the runner's hello
	require.NoError(t, err)
	require.NoError(t, imp.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Goodbye{Goodbye: &prpv1.Goodbye{Code: failure.RunnerTicketReplayed}}}))
	_ = ws.Close(websocket.StatusNormalClosure, "")

	// The real gateway dials in, authenticates and drives a turn.
	require.NoError(t, e.gw.dialIn(url, clientTLS))
	e.gw.waitConns(1)
	runOneTurn(t, e)

	// A dropped connection is re-established by the gateway dialing again
	// (with the lease now); unacknowledged events are replayed.
	e.gw.dropConn()
	require.NoError(t, e.gw.dialIn(url, clientTLS))
	e.gw.waitConns(2)
	e.gw.mu.Lock()
	assert.Equal(t, prp.KindLease, e.gw.hellos[1].GetCredentialKind())
	// The reconnect never goes back in generation. (Whether it is strictly
	// newer depends on whether the runner saw the drop before the gateway
	// dialled again; asserting that raced — see the session's closing note.)
	assert.GreaterOrEqual(t, e.gw.hellos[1].GetResume().GetConnectionGeneration(), e.gw.hellos[0].GetResume().GetConnectionGeneration())
	e.gw.mu.Unlock()
	require.Equal(t, ExitOK, p.stop(t))
	assert.Equal(t, runnerstate.LifecycleStopped, e.state().Lifecycle)
}

func TestR6_ListenWSValidatesItsFlags(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	for name, mod := range map[string]func(*Config){
		"path of another runner": func(c *Config) { c.ListenPath = ListenPath("someone-else") },
		"not an ip":              func(c *Config) { c.ListenAddress = "localhost" },
		"key without cert":       func(c *Config) { c.ListenTLSKey = "/nonexistent" },
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Run(context.Background(), e.config(func(c *Config) {
				c.ConnectURL = ""
				c.ListenAddress, c.ListenPort, c.ListenPath = "127.0.0.1", freePort(t), ListenPath(tRunner)
				mod(c)
			}))
			require.Error(t, err)
		})
	}
	// A port in use is a bind conflict.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	_, err = Run(context.Background(), e.config(func(c *Config) {
		c.ConnectURL = ""
		c.ListenAddress, c.ListenPort, c.ListenPath = "127.0.0.1", l.Addr().(*net.TCPAddr).Port, ListenPath(tRunner)
	}))
	require.ErrorContains(t, err, "runner_ingress_bind_conflict")
}

func TestR6_ReconnectDelayIsJittered(t *testing.T) {
	t.Parallel()
	seen := map[time.Duration]bool{}
	for i := 0; i < 200; i++ {
		d := backoff.Jittered(time.Second)
		require.GreaterOrEqual(t, d, 500*time.Millisecond)
		require.LessOrEqual(t, d, time.Second)
		seen[d] = true
	}
	require.Greater(t, len(seen), 50, "delays are spread, not synchronised")
	require.Zero(t, backoff.Jittered(0))
}

func TestR6_SilentGatewayConnectionIsDroppedAndReestablished(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	// The fake gateway never pings: every connection falls silent.
	p := e.start(func(c *Config) { c.SilenceTimeout = 300 * time.Millisecond })
	e.gw.waitConns(1)
	start := time.Now()
	e.gw.waitConns(2)
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "not before the silence timeout")
	e.gw.mu.Lock()
	// The reconnect never goes back in generation. (Whether it is strictly
	// newer depends on whether the runner saw the drop before the gateway
	// dialled again; asserting that raced — see the session's closing note.)
	assert.GreaterOrEqual(t, e.gw.hellos[1].GetResume().GetConnectionGeneration(), e.gw.hellos[0].GetResume().GetConnectionGeneration())
	e.gw.mu.Unlock()
	require.Equal(t, ExitOK, p.stop(t))
}
