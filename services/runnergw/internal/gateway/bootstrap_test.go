package gateway

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
)

func TestS5_TheLaunchedRunnersEnvironmentHoldsNoTicket(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, opened, err := rl.attach(ctx, "run-environ", nil, testInput("environ", "acme", "hello"))
	require.NoError(t, err)
	require.NotNil(t, opened, "the runner connected with the ticket it read from its pipe")
	defer s.CloseSend()
	pid := strconv.Itoa(int(opened.GetRunnerProcess().GetPid()))
	require.NotEqual(t, "0", pid)

	environ, err := os.ReadFile("/proc/" + pid + "/environ")
	require.NoError(t, err)
	var names []string
	for kv := range bytes.SplitSeq(bytes.TrimRight(environ, "\x00"), []byte{0}) {
		name, _, _ := bytes.Cut(kv, []byte("="))
		names = append(names, string(name))
	}
	require.ElementsMatch(t, []string{"PATH", "HOME"}, names, "runnerd's environment is the allow-list only")
	require.NotContains(t, string(environ), prp.EnvBootstrapTicket)
	require.NotContains(t, string(environ), "bootstrap")

	cmdline, err := os.ReadFile("/proc/" + pid + "/cmdline")
	require.NoError(t, err)
	require.Contains(t, string(cmdline), "--bootstrap-ticket-fd\x003\x00")
}

// silentGateway serves runner connections with a short handshake timeout.
func silentGateway(t *testing.T, timeout time.Duration) (url string, auth *prp.Authority) {
	t.Helper()
	auth = prp.NewAuthority([]byte("handshake-test-key"), nil)
	auth.HandshakeTimeout = timeout
	g := New(Config{StateRoot: t.TempDir(), Authority: auth, Logger: slog.New(slog.DiscardHandler)})
	srv := httptest.NewServer(g)
	t.Cleanup(func() {
		srv.Close()
		g.Close()
	})
	return "ws" + strings.TrimPrefix(srv.URL, "http") + ConnectPath, auth
}

// requireHandshakeTimeout reads the Goodbye and then the close.
func requireHandshakeTimeout(ctx context.Context, t *testing.T, c *prp.Conn) {
	t.Helper()
	f, err := c.Read(ctx)
	require.NoError(t, err)
	require.Equal(t, failure.RunnerHandshakeTimeout, f.GetGoodbye().GetCode(), "%v", f)
	_, err = c.Read(ctx)
	var ce websocket.CloseError
	require.True(t, errors.As(err, &ce), "a close frame, not a dropped connection: %v", err)
	require.Equal(t, websocket.StatusPolicyViolation, ce.Code)
	require.Equal(t, failure.RunnerHandshakeTimeout, ce.Reason)
}

func TestS5_AConnectionThatSendsNothingGetsAGoodbyeHandshakeTimeout(t *testing.T) {
	t.Parallel()
	url, _ := silentGateway(t, 100*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, nil)
	require.NoError(t, err)
	defer ws.CloseNow()
	requireHandshakeTimeout(ctx, t, prp.NewConn(ws))
}

func TestS5_ARunnerThatNeverSendsItsProofGetsAGoodbyeHandshakeTimeout(t *testing.T) {
	t.Parallel()
	url, auth := silentGateway(t, 2*time.Second) // long enough for the hello to arrive first on a loaded machine
	const runnerID, scope = "runner-silent", "scope-silent"
	ticket, err := auth.MintTicket(runnerID, scope, time.Minute)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, nil)
	require.NoError(t, err)
	defer ws.CloseNow()
	c := prp.NewConn(ws)
	require.NoError(t, c.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Hello{Hello: &prpv1.Hello{
		Protocol: prp.Protocol, VersionMin: prp.Version, VersionMax: prp.Version,
		CredentialKind: prp.KindBootstrap, CredentialClaims: ticket.Claims, ClientNonce: strings.Repeat("n", 32),
		Identity: &prpv1.RunnerIdentity{RunnerInstanceId: runnerID, SessionScope: scope},
	}}}))
	f, err := c.Read(ctx)
	require.NoError(t, err)
	require.NotNil(t, f.GetChallenge(), "%v", f)
	// No proof follows.
	requireHandshakeTimeout(ctx, t, c)
}
