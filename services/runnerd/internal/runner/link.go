package runner

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/tether-run/tether/pkg/backoff"
	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
)

// link is runnerd's connection manager: it dials the gateway (dial_ws_*)
// or accepts its dial-in (listen_ws), runs each handshake off the loop,
// keeps at most one live connection whose frames it reads into inbound, and
// paces the next dial with a jittered backoff. It knows nothing of the
// runner's state: what a new or lost connection means for the cursor and
// the lifecycle is the Runner's (handleDialed, dropConn). The loop goroutine
// owns its fields; the goroutines it starts only use the channels.
type link struct {
	log      *slog.Logger
	dialer   *gatewayDialer  // dial_ws_loopback, dial_wss
	listener *runnerListener // listen_ws
	accepted chan accepted   // listen_ws: upgraded connections awaiting their handshake
	inbound  chan inbound    // frames (and read errors) of live connections
	dialed   chan dialResult // finished handshakes
	// cred is the credential the next handshake presents (the bootstrap
	// ticket, then the lease each Welcome hands over).
	cred prp.Credential

	ctx context.Context // ends every connection and handshake at exit
	wg  sync.WaitGroup  // the goroutines started here

	live              *liveConn
	seq               int // the newest connection's id
	dialing           bool
	nextDial          time.Time
	backoff           backoff.Backoff // the next gateway dial's delay
	disconnectedSince time.Time
}

type liveConn struct {
	id           int
	c            *prp.Conn
	cancel       context.CancelFunc
	connectionID string
	lastHeard    time.Time
}

type inbound struct {
	connID int
	f      *prpv1.Frame
	err    error
}

type dialResult struct {
	c       *prp.Conn
	cancel  context.CancelFunc
	welcome *prpv1.Welcome
	cred    prp.Credential
	err     error
	inbound bool           // listen_ws: the gateway dialed in
	used    prp.Credential // the credential the handshake presented
}

func newLink(cfg *Config) *link {
	return &link{
		log:      cfg.Logger,
		cred:     cfg.Ticket,
		inbound:  make(chan inbound, 64),
		accepted: make(chan accepted),
		dialed:   make(chan dialResult, 1),
		backoff:  backoff.Backoff{Min: cfg.BackoffMin, Max: cfg.BackoffMax, Jitter: true},
	}
}

// open sets up the configured transport: the listener (listen_ws) or the
// dialer with its pinned addresses.
func (l *link) open(ctx context.Context, cfg *Config) error {
	if cfg.listening() {
		ln, err := newRunnerListener(cfg, l.accepted)
		if err != nil {
			return err
		}
		l.listener = ln
		l.log.Info("listening for the gateway (listen_ws)", "url", ln.boundURL, "tls", ln.isTLS)
		return nil
	}
	d, err := newGatewayDialer(ctx, cfg.ConnectURL, cfg.CABundlePath)
	if err != nil {
		return err
	}
	l.dialer = d
	return nil
}

// stopListening stops accepting dial-ins (listen_ws).
func (l *link) stopListening() {
	if l.listener != nil {
		l.listener.Close()
	}
}

// connected reports a live connection.
func (l *link) connected() bool { return l.live != nil }

// current reports whether connID is the live connection.
func (l *link) current(connID int) bool { return l.live != nil && l.live.id == connID }

// dialDue reports whether a dial is to start now: no connection, none
// being dialed, and the backoff has passed.
func (l *link) dialDue(now time.Time) bool {
	return l.live == nil && !l.dialing && l.dialer != nil && !now.Before(l.nextDial)
}

// silentFor is how long nothing arrived on the live connection (0 without
// one).
func (l *link) silentFor(now time.Time) time.Duration {
	if l.live == nil {
		return 0
	}
	return now.Sub(l.live.lastHeard)
}

// startDial dials the gateway and runs the handshake with hello, off the
// loop; the result arrives on dialed.
func (l *link) startDial(hello *prpv1.Hello) {
	l.dialing = true
	cred := l.cred
	l.spawn(func() dialResult {
		ctx, cancel := context.WithCancel(l.ctx)
		ws, err := l.dialer.Dial(ctx)
		if err != nil {
			cancel()
			return dialResult{err: err}
		}
		return handshake(ctx, cancel, ws, hello, cred)
	})
}

// startHandshake runs the handshake on an inbound (listen_ws) connection.
// The peer is untrusted until its challenge verifies.
func (l *link) startHandshake(a accepted, hello *prpv1.Hello) {
	cred := l.cred
	l.spawn(func() dialResult {
		defer a.release()
		ctx, cancel := context.WithCancel(l.ctx)
		res := handshake(ctx, cancel, a.ws, hello, cred)
		res.inbound, res.used = true, cred
		return res
	})
}

// spawn runs connect off the loop and hands its result to the loop (or
// closes the connection when the runner is exiting).
func (l *link) spawn(connect func() dialResult) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		res := connect()
		select {
		case l.dialed <- res:
		case <-l.ctx.Done():
			if res.c != nil {
				res.cancel()
				_ = res.c.Close(websocket.StatusGoingAway, "runner exiting")
			}
		}
	}()
}

// handshake runs the runner half of the PRP handshake on an open WebSocket.
func handshake(ctx context.Context, cancel context.CancelFunc, ws *websocket.Conn, hello *prpv1.Hello, cred prp.Credential) dialResult {
	c := prp.NewConn(ws)
	w, next, err := prp.ClientHandshake(ctx, c, cred, hello)
	if err != nil {
		_ = ws.CloseNow()
		cancel()
		return dialResult{err: err}
	}
	return dialResult{c: c, cancel: cancel, welcome: w, cred: next}
}

// retryLater schedules the next dial after a failed one; it returns the
// delay.
func (l *link) retryLater() time.Duration {
	wait := l.backoff.Next()
	l.nextDial = time.Now().Add(wait)
	return wait
}

// adopt makes a finished handshake the live connection (a newer listen_ws
// dial-in supersedes the live one) and starts reading it.
func (l *link) adopt(d dialResult) *liveConn {
	if l.live != nil {
		l.closeAsync(l.live, "superseded by a newer connection")
	}
	l.cred = d.cred
	l.backoff.Reset()
	l.seq++
	cctx, cancel := context.WithCancel(l.ctx)
	stop := func() { cancel(); d.cancel() }
	lc := &liveConn{id: l.seq, c: d.c, cancel: stop, connectionID: d.welcome.GetConnectionId(), lastHeard: time.Now()}
	l.live = lc
	l.wg.Add(1)
	go l.readLoop(cctx, lc)
	return lc
}

func (l *link) readLoop(ctx context.Context, lc *liveConn) {
	defer l.wg.Done()
	for {
		f, err := lc.c.Read(ctx)
		if err != nil && prp.CodeOf(err) == failure.RunnerProtocolError {
			// One undecodable frame; the connection itself is fine.
			l.log.Warn("ignoring undecodable frame", "err", err)
			continue
		}
		select {
		case l.inbound <- inbound{connID: lc.id, f: f, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// closeAsync forgets lc (the live connection) and closes it off the loop.
func (l *link) closeAsync(lc *liveConn, why string) {
	l.live = nil
	lc.cancel()
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		_ = lc.c.Close(websocket.StatusGoingAway, why)
	}()
}

// drop closes the live connection and schedules the next dial after a
// jittered delay. It reports whether there was a connection.
func (l *link) drop() bool {
	if l.live == nil {
		return false
	}
	l.closeAsync(l.live, "connection dropped")
	l.disconnectedSince = time.Now()
	l.nextDial = time.Now().Add(backoff.Jittered(l.backoff.Peek()))
	return true
}

// goodbye sends a Goodbye and closes the live connection (at exit).
func (l *link) goodbye(code, msg string) {
	if l.live == nil {
		return
	}
	lc := l.live
	l.live = nil
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = lc.c.Write(ctx, &prpv1.Frame{Kind: &prpv1.Frame_Goodbye{Goodbye: &prpv1.Goodbye{Code: code, Message: msg}}})
	cancel()
	lc.cancel()
	_ = lc.c.Close(websocket.StatusNormalClosure, code)
}

// write sends one frame on the live connection (none: nothing is sent).
func (l *link) write(f *prpv1.Frame) error {
	if l.live == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return l.live.c.Write(ctx, f)
}

// writeRaw sends encoded frames in order on the live connection, stopping
// at the first failure.
func (l *link) writeRaw(frames [][]byte) error {
	for _, fr := range frames {
		if l.live == nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := l.live.c.WriteRaw(ctx, fr)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}
