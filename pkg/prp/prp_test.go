package prp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testRunner = "runner-1"
	testScope  = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func testHello() *prpv1.Hello {
	return &prpv1.Hello{
		Identity: &prpv1.RunnerIdentity{
			RunnerInstanceId:    testRunner,
			EnvironmentLeaseId:  "lease-1",
			NormalizedSessionId: "session-1",
			SessionScope:        testScope,
		},
		Resume:    &prpv1.ResumeCursor{NextSourceSeq: 1},
		Lifecycle: "connecting",
	}
}

type result struct {
	welcome *prpv1.Welcome
	next    Credential
	acc     *Accepted
	srvErr  error
	cliErr  error
}

// handshake runs both halves over an in-memory pipe.
func handshake(t *testing.T, a *Authority, cred Credential, hello *prpv1.Hello, acked uint64) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv, cli := newPipe()
	var r result
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		acc, err := a.Accept(ctx, srv)
		r.acc, r.srvErr = acc, err
		if err != nil {
			return
		}
		r.srvErr = a.Welcome(ctx, srv, acc, acked)
	}()
	r.welcome, r.next, r.cliErr = ClientHandshake(ctx, cli, cred, hello)
	if r.cliErr != nil {
		_ = cli.Close(websocket.StatusPolicyViolation, "handshake failed")
	}
	wg.Wait()
	_ = srv.Close(websocket.StatusNormalClosure, "")
	return r
}

func TestHandshakeBootstrapThenLease(t *testing.T) {
	clk := newClock()
	a := NewAuthority([]byte("key-0123456789abcdef"), clk.now)
	ticket, err := a.MintTicket(testRunner, testScope, time.Minute)
	require.NoError(t, err)

	// The ticket survives its env-var form.
	parsed, err := ParseCredential(ticket.Encode())
	require.NoError(t, err)
	require.Equal(t, ticket, parsed)
	assert.NotContains(t, ticket.String(), ticket.Encode())

	r := handshake(t, a, parsed, testHello(), 7)
	require.NoError(t, r.srvErr)
	require.NoError(t, r.cliErr)
	assert.Equal(t, uint64(7), r.welcome.GetAckedSourceSeq())
	assert.Equal(t, r.acc.ConnectionID, r.welcome.GetConnectionId())
	assert.Equal(t, KindBootstrap, r.acc.Claims.Kind)
	assert.Equal(t, testRunner, r.acc.Hello.GetIdentity().GetRunnerInstanceId())
	require.Equal(t, KindLease, r.next.Kind)
	assert.Equal(t, clk.now().Add(LeaseTTL).UnixMilli(), r.welcome.GetLeaseExpiresAtUnixMs())

	// A restarted gateway with the same key recognises the lease.
	a2 := NewAuthority([]byte("key-0123456789abcdef"), clk.now)
	r2 := handshake(t, a2, r.next, testHello(), 9)
	require.NoError(t, r2.srvErr)
	require.NoError(t, r2.cliErr)
	assert.Equal(t, KindLease, r2.acc.Claims.Kind)
	assert.Equal(t, r.next, r2.next, "a lease handshake keeps the same credential")
	assert.Empty(t, r2.welcome.GetLeaseSecret())

	// Leases are reusable.
	r3 := handshake(t, a2, r.next, testHello(), 9)
	require.NoError(t, r3.cliErr)
}

func TestHandshakeWrongSecret(t *testing.T) {
	a := NewAuthority([]byte("key-A"), nil)
	ticket, err := a.MintTicket(testRunner, testScope, time.Minute)
	require.NoError(t, err)
	bad := ticket
	bad.Secret = append([]byte(nil), ticket.Secret...)
	bad.Secret[0] ^= 1
	r := handshake(t, a, bad, testHello(), 0)
	require.Error(t, r.cliErr)
	assert.Equal(t, failure.RunnerAuthFailed, CodeOf(r.cliErr), "runner refuses the gateway's proof")
	require.Error(t, r.srvErr)

	// A gateway with a different key cannot verify either.
	other := NewAuthority([]byte("key-B"), nil)
	r = handshake(t, other, ticket, testHello(), 0)
	assert.Equal(t, failure.RunnerAuthFailed, CodeOf(r.cliErr))

	// The legitimate ticket still works: failed attempts do not consume it.
	r = handshake(t, a, ticket, testHello(), 0)
	require.NoError(t, r.cliErr)
}

// pendingAccept runs a.Accept on one end of a pipe in the background and
// returns the other end and Accept's error.
func pendingAccept(ctx context.Context, t *testing.T, a *Authority) (*Conn, <-chan error) {
	srv, cli := newPipe()
	t.Cleanup(func() { _ = srv.Close(websocket.StatusNormalClosure, "") })
	errc := make(chan error, 1)
	go func() { _, err := a.Accept(ctx, srv); errc <- err }()
	return cli, errc
}

// helloForChallenge sends a bootstrap hello for ticket as a runner would
// and returns the gateway's challenge.
func helloForChallenge(ctx context.Context, t *testing.T, cli *Conn, ticket Credential) *prpv1.Frame {
	t.Helper()
	h := testHello()
	h.Protocol, h.VersionMin, h.VersionMax = Protocol, 1, 1
	h.CredentialKind, h.CredentialClaims, h.ClientNonce = KindBootstrap, ticket.Claims, strings.Repeat("a", 32)
	require.NoError(t, cli.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Hello{Hello: h}}))
	f, err := cli.Read(ctx)
	require.NoError(t, err)
	require.NotNil(t, f.GetChallenge())
	return f
}

func TestHandshakeServerRejectsWrongClientProof(t *testing.T) {
	a := NewAuthority([]byte("key"), nil)
	ticket, err := a.MintTicket(testRunner, testScope, time.Minute)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cli, errc := pendingAccept(ctx, t, a)
	helloForChallenge(ctx, t, cli, ticket)
	require.NoError(t, cli.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Proof{Proof: &prpv1.Proof{ClientProof: strings.Repeat("0", 64)}}}))
	err = <-errc
	assert.Equal(t, failure.RunnerAuthFailed, CodeOf(err))
	f, err := cli.Read(ctx)
	require.NoError(t, err)
	assert.Equal(t, failure.RunnerAuthFailed, f.GetGoodbye().GetCode())
}

func TestHandshakeExpired(t *testing.T) {
	clk := newClock()
	a := NewAuthority([]byte("key"), clk.now)
	ticket, err := a.MintTicket(testRunner, testScope, time.Minute)
	require.NoError(t, err)
	clk.add(time.Minute)
	r := handshake(t, a, ticket, testHello(), 0)
	assert.Equal(t, failure.RunnerCredentialExpired, CodeOf(r.srvErr))
	assert.Equal(t, failure.RunnerCredentialExpired, CodeOf(r.cliErr), "the goodbye carries the code to the runner")
}

func TestHandshakeReplayedTicket(t *testing.T) {
	a := NewAuthority([]byte("key"), nil)
	ticket, err := a.MintTicket(testRunner, testScope, time.Minute)
	require.NoError(t, err)
	r := handshake(t, a, ticket, testHello(), 0)
	require.NoError(t, r.cliErr)
	r = handshake(t, a, ticket, testHello(), 0)
	assert.Equal(t, failure.RunnerTicketReplayed, CodeOf(r.srvErr))
	assert.Equal(t, failure.RunnerTicketReplayed, CodeOf(r.cliErr))
}

func TestHandshakeTamperedClaims(t *testing.T) {
	a := NewAuthority([]byte("key"), nil)
	ticket, err := a.MintTicket(testRunner, testScope, time.Minute)
	require.NoError(t, err)
	cl, raw, err := DecodeClaims(ticket.Claims)
	require.NoError(t, err)
	require.Equal(t, testRunner, cl.RunnerInstanceID)

	// Extend the expiry by editing the public claims: the secret no longer matches.
	tampered := strings.Replace(string(raw), `"expiresAtUnixMs":`, `"expiresAtUnixMs":9`, 1)
	bad := ticket
	bad.Claims = b64.EncodeToString([]byte(tampered))
	r := handshake(t, a, bad, testHello(), 0)
	assert.Equal(t, failure.RunnerAuthFailed, CodeOf(r.cliErr))

	// Claims for another runner than the hello identity.
	other, err := a.MintTicket("runner-2", testScope, time.Minute)
	require.NoError(t, err)
	r = handshake(t, a, other, testHello(), 0)
	assert.Equal(t, failure.RunnerAuthFailed, CodeOf(r.srvErr))

	// Garbage claims.
	_, err = ParseCredential("not-a-credential")
	assert.Equal(t, failure.RunnerAuthFailed, CodeOf(err))
	_, err = ParseCredential("e30." + b64.EncodeToString(ticket.Secret))
	assert.Equal(t, failure.RunnerAuthFailed, CodeOf(err))
}

func TestHandshakeProtocolErrors(t *testing.T) {
	a := NewAuthority([]byte("key"), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for name, f := range map[string]*prpv1.Frame{
		"not hello": {Kind: &prpv1.Frame_Ping{Ping: &prpv1.Ping{Nonce: 1}}},
		"wrong protocol": {Kind: &prpv1.Frame_Hello{Hello: &prpv1.Hello{
			Protocol: "x", VersionMin: 1, VersionMax: 1, ClientNonce: strings.Repeat("a", 32)}}},
		"no common version": {Kind: &prpv1.Frame_Hello{Hello: &prpv1.Hello{
			Protocol: Protocol, VersionMin: 2, VersionMax: 3, ClientNonce: strings.Repeat("a", 32)}}},
	} {
		t.Run(name, func(t *testing.T) {
			srv, cli := newPipe()
			defer srv.Close(websocket.StatusNormalClosure, "")
			require.NoError(t, cli.Write(ctx, f))
			_, err := a.Accept(ctx, srv)
			assert.Equal(t, failure.RunnerProtocolError, CodeOf(err))
		})
	}
}

func TestS5_ASilentPeerIsSentAGoodbyeHandshakeTimeout(t *testing.T) {
	t.Parallel()
	a := NewAuthority([]byte("key"), nil)
	a.HandshakeTimeout = 50 * time.Millisecond
	srv, cli := newPipe()
	defer srv.Close(websocket.StatusNormalClosure, "")
	_, err := a.Accept(context.Background(), srv)
	require.Equal(t, failure.RunnerHandshakeTimeout, CodeOf(err), "%v", err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := cli.Read(ctx)
	require.NoError(t, err)
	require.Equal(t, failure.RunnerHandshakeTimeout, f.GetGoodbye().GetCode(), "%v", f)
	_, err = cli.Read(ctx)
	require.ErrorIs(t, err, errPipeClosed, "the connection is closed after the goodbye")
}

func TestS5_AHelloWithoutItsProofTimesOutWithAGoodbye(t *testing.T) {
	t.Parallel()
	a := NewAuthority([]byte("key"), nil)
	a.HandshakeTimeout = time.Second // the hello arrives well before it, even on a loaded machine
	ticket, err := a.MintTicket(testRunner, testScope, time.Minute)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, errc := pendingAccept(ctx, t, a)
	helloForChallenge(ctx, t, cli, ticket)
	// ...and no proof.
	require.Equal(t, failure.RunnerHandshakeTimeout, CodeOf(<-errc))
	f, err := cli.Read(ctx)
	require.NoError(t, err)
	require.Equal(t, failure.RunnerHandshakeTimeout, f.GetGoodbye().GetCode())

	// The ticket was not consumed: the runner may still use it.
	a.HandshakeTimeout = 0
	r := handshake(t, a, ticket, testHello(), 0)
	require.NoError(t, r.cliErr)
}

func TestCanonicalJSON(t *testing.T) {
	b, err := CanonicalJSON(map[string]any{"b": 1, "a": map[string]any{"z": "<&>", "y": []any{2, "x"}}})
	require.NoError(t, err)
	assert.Equal(t, `{"a":{"y":[2,"x"],"z":"<&>"},"b":1}`, string(b))
	b, err = CanonicalJSON([]byte(` { "b" : 1.50, "a" : null } `))
	require.NoError(t, err)
	// RFC 8785 numbers: the shortest JavaScript form, whatever the text.
	assert.Equal(t, `{"a":null,"b":1.5}`, string(b))
	_, err = CanonicalJSON([]byte(`{} {}`))
	require.Error(t, err)
	b, err = CanonicalJSON(&prpv1.Ack{AckedSourceSeq: 3})
	require.NoError(t, err)
	assert.Equal(t, `{"ackedSourceSeq":"3"}`, string(b))
}

func TestMarshalRoundTripCamelCase(t *testing.T) {
	f := &prpv1.Frame{Kind: &prpv1.Frame_Events{Events: &prpv1.EventBatch{Events: []*prpv1.Event{{
		SourceSeq: 5, SourceEventId: "event_r_0000000000000005", EventType: "item.delta", RunId: "run-1",
	}}}}}
	b, err := Marshal(f)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"sourceSeq":"5"`)
	assert.Contains(t, string(b), `"eventType":"item.delta"`)
	assert.NotContains(t, string(b), " ")
	g, err := Unmarshal(b)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), g.GetEvents().GetEvents()[0].GetSourceSeq())

	// Unknown fields are ignored; no kind is an error.
	g, err = Unmarshal([]byte(`{"ack":{"ackedSourceSeq":"4","future":true},"futureKind":{}}`))
	require.NoError(t, err)
	assert.Equal(t, uint64(4), g.GetAck().GetAckedSourceSeq())
	_, err = Unmarshal([]byte(`{"futureKind":{}}`))
	assert.Equal(t, failure.RunnerProtocolError, CodeOf(err))
	_, err = Unmarshal([]byte(`{`))
	assert.Equal(t, failure.RunnerProtocolError, CodeOf(err))
}

func TestG4_OversizeFrameFailsWithProviderFrameTooLarge(t *testing.T) {
	big := strings.Repeat("x", MaxFrameBytes)
	f := &prpv1.Frame{Kind: &prpv1.Frame_Goodbye{Goodbye: &prpv1.Goodbye{Message: big}}}
	_, err := Marshal(f)
	assert.Equal(t, failure.ProviderFrameTooLarge, CodeOf(err))
	_, err = Unmarshal(make([]byte, MaxFrameBytes+1))
	assert.Equal(t, failure.ProviderFrameTooLarge, CodeOf(err))

	// Over a real WebSocket: the receiver reports provider_frame_too_large.
	errc := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			errc <- err
			return
		}
		c := NewConn(ws)
		_, err = c.Read(r.Context())
		errc <- err
		_ = c.Close(websocket.StatusMessageTooBig, "too big")
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	require.NoError(t, err)
	defer ws.CloseNow()
	payload := `{"goodbye":{"message":"` + strings.Repeat("x", MaxFrameBytes) + `"}}`
	_ = ws.Write(ctx, websocket.MessageText, []byte(payload))
	err = <-errc
	assert.Equal(t, failure.ProviderFrameTooLarge, CodeOf(err))
	cli := NewConn(ws)
	assert.Equal(t, failure.ProviderFrameTooLarge, CodeOf(cli.WriteRaw(ctx, []byte(payload))))
}

func TestHandshakeOverWebSocket(t *testing.T) {
	a := NewAuthority([]byte("key"), nil)
	ticket, err := a.MintTicket(testRunner, testScope, time.Minute)
	require.NoError(t, err)
	srvDone := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			srvDone <- err
			return
		}
		c := NewConn(ws)
		defer c.Close(websocket.StatusNormalClosure, "bye")
		acc, err := a.Accept(r.Context(), c)
		if err == nil {
			err = a.Welcome(r.Context(), c, acc, 0)
		}
		if err == nil {
			var f *prpv1.Frame
			f, err = c.Read(r.Context())
			if err == nil && f.GetPing() == nil {
				err = &Error{Code: "unexpected", Message: "no ping"}
			}
		}
		srvDone <- err
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	require.NoError(t, err)
	c := NewConn(ws)
	_, lease, err := ClientHandshake(ctx, c, ticket, testHello())
	require.NoError(t, err)
	assert.Equal(t, KindLease, lease.Kind)
	require.NoError(t, c.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Ping{Ping: &prpv1.Ping{Nonce: 1}}}))
	require.NoError(t, <-srvDone)
	_ = c.Close(websocket.StatusNormalClosure, "")
}
