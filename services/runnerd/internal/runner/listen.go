package runner

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// maxPendingInbound bounds inbound connections still in their handshake.
const maxPendingInbound = 4

// accepted is an inbound WebSocket (listen_ws) waiting for its handshake;
// release frees its slot once the handshake ended either way.
type accepted struct {
	ws      *websocket.Conn
	release func()
}

// runnerListener serves the runner's WebSocket endpoint for listen_ws: the
// gateway dials in (through the sandbox's ingress) and runnerd still opens
// the PRP handshake as the client. Upgrades must hit exactly the runner's
// path, carry no query and ask for no WebSocket extension (else HTTP 400).
type runnerListener struct {
	srv      *http.Server
	ln       net.Listener
	path     string
	out      chan<- accepted
	done     chan struct{}
	sem      chan struct{}
	served   chan struct{}
	isTLS    bool
	boundURL string
}

func newRunnerListener(cfg *Config, out chan<- accepted) (*runnerListener, error) {
	if net.ParseIP(cfg.ListenAddress) == nil {
		return nil, fmt.Errorf("--listen-address %q must be an IP address", cfg.ListenAddress)
	}
	if cfg.ListenPort <= 0 || cfg.ListenPort > 65535 {
		return nil, fmt.Errorf("--listen-port %d must be 1..65535", cfg.ListenPort)
	}
	if cfg.ListenPath != ListenPath(cfg.RunnerID) {
		return nil, fmt.Errorf("runner listener path must exactly match the configured runner: %s", ListenPath(cfg.RunnerID))
	}
	var tlsCfg *tls.Config
	if cfg.ListenTLSCert != "" || cfg.ListenTLSKey != "" {
		if cfg.ListenTLSCert == "" || cfg.ListenTLSKey == "" {
			return nil, errors.New("--listen-tls-cert and --listen-tls-key go together")
		}
		if err := isPrivateFile(cfg.ListenTLSKey); err != nil {
			return nil, fmt.Errorf("--listen-tls-key: %w", err)
		}
		cert, err := tls.LoadX509KeyPair(cfg.ListenTLSCert, cfg.ListenTLSKey)
		if err != nil {
			return nil, fmt.Errorf("listener TLS: %w", err)
		}
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	}
	addr := net.JoinHostPort(cfg.ListenAddress, strconv.Itoa(cfg.ListenPort))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("runner_ingress_bind_conflict: %w", err)
	}
	l := &runnerListener{
		ln: ln, path: cfg.ListenPath, out: out, done: make(chan struct{}), sem: make(chan struct{}, maxPendingInbound),
		served: make(chan struct{}), isTLS: tlsCfg != nil,
	}
	scheme := "ws"
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
		scheme = "wss"
	}
	l.boundURL = scheme + "://" + l.ln.Addr().String() + l.path
	l.srv = &http.Server{Handler: l, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 16 << 10,
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)}
	go func() {
		defer close(l.served)
		_ = l.srv.Serve(ln)
	}()
	return l, nil
}

func (l *runnerListener) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != l.path || req.URL.RawQuery != "" || req.Header.Get("Sec-WebSocket-Extensions") != "" {
		http.Error(w, "bad runner upgrade", http.StatusBadRequest)
		return
	}
	select {
	case l.sem <- struct{}{}:
	default:
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	ws, err := websocket.Accept(w, req, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		<-l.sem
		return
	}
	var once sync.Once
	release := func() { once.Do(func() { <-l.sem }) }
	select {
	case l.out <- accepted{ws: ws, release: release}:
	case <-l.done:
		_ = ws.CloseNow()
		release()
	}
}

// Close stops accepting; live connections are closed by their owner.
func (l *runnerListener) Close() {
	select {
	case <-l.done:
		return
	default:
	}
	close(l.done)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = l.srv.Shutdown(ctx)
	<-l.served
}
