package gateway

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/backoff"
	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/prp"
)

// selectTransport resolves the run's transport (G3) and checks that this
// gateway and the runnerd build both support it (G2), before anything is
// launched or opened.
func (g *Gateway) selectTransport(open *gatewayv1.Open) (string, error) {
	company := open.GetInput().GetBinding().GetCompanyId()
	runAuthorised := open.GetTarget().GetRunnerIngressAuthorized()
	authorised := runAuthorised && g.cfg.Ingress.Admits(company)
	mode, err := ResolveTransportMode(open.GetTarget().GetMode(), authorised)
	if err != nil {
		if failure.CodeOf(err) == failure.RunnerIngressUnavailable {
			why := "the run's target is not authorised for sandbox ingress"
			if runAuthorised {
				why = "this gateway's ingress policy (-runner-ingress-companies) does not admit company " + company
			}
			return "", failure.New(codes.FailedPrecondition, failure.RunnerIngressUnavailable, "listen_ws refused: %s", why)
		}
		return "", err
	}
	if mode == prp.ModeDialWSS && g.cfg.PublicURL == "" {
		return "", failure.New(codes.FailedPrecondition, failure.RunnerDirectWSSFailed,
			"this gateway serves no TLS runner listener (-runner-tls-cert, -runner-tls-key)")
	}
	if b := g.cfg.Build; b != nil && !slices.Contains(b.GetPrpTransportModes(), mode) {
		return "", failure.New(codes.FailedPrecondition, failure.Qualified(failure.RunnerRemoteTransportCapabilityMissing, mode),
			"runner build supports %v", b.GetPrpTransportModes())
	}
	return mode, nil
}

// startDialLoop keeps a listening runner (listen_ws) connected: the gateway
// dials its listener, serves the connection until it ends, and dials again
// (jittered backoff) while the runner process lives and the gateway runs.
// The caller holds r.mu. A launch replaces any earlier loop (its runner is
// gone, even when the new listener happens to get the same port); an
// adoption keeps a loop already dialling the same listener.
func (g *Gateway) startDialLoop(r *runner, url string, launched bool, alive func() bool) {
	if !launched && r.dialURL == url {
		return // this listener is being dialled already
	}
	// A loop for an earlier listener (a runner that exited; its
	// replacement listens on another port) stops at its next turn.
	r.dialGen++
	gen := r.dialGen
	r.dialURL = url
	current := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.dialGen == gen
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer func() {
			r.mu.Lock()
			if r.dialGen == gen {
				r.dialURL = ""
			}
			r.mu.Unlock()
		}()
		retry := backoff.Backoff{Min: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: true}
		for g.ctx.Err() == nil && current() && alive() {
			ws, err := g.dialRunnerListener(url)
			if err == nil {
				retry.Reset()
				g.serveRunner(g.ctx, prp.NewConn(ws), prp.ModeListenWS)
			} else {
				g.log.Debug("runner listener not reachable yet", "url", url, "err", err)
			}
			if !backoff.Sleep(g.ctx, retry.Next()) {
				return
			}
		}
	}()
}

// dialRunnerListener opens a WebSocket to a runner's listener.
func (g *Gateway) dialRunnerListener(url string) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(g.ctx, 5*time.Second)
	defer cancel()
	tr := &http.Transport{Proxy: nil, TLSClientConfig: g.cfg.IngressTLS, TLSHandshakeTimeout: 5 * time.Second}
	defer tr.CloseIdleConnections()
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	return ws, err
}

// freePort picks a free TCP port on host.
func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// launchRecord is what a gateway remembers about a runner it launched, so a
// restarted gateway can dial a listening runner again.
type launchRecord struct {
	Mode      string `json:"mode"`
	ListenURL string `json:"listenUrl,omitempty"`
}

const launchRecordFile = "launch.json"

func writeLaunchRecord(scopeDir string, rec launchRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return writeScopeFile(scopeDir, "", launchRecordFile, b)
}

func readLaunchRecord(scopeDir string) launchRecord {
	var rec launchRecord
	b, err := readScopeFile(scopeDir, "", launchRecordFile, 1<<20)
	if err == nil {
		_ = json.Unmarshal(b, &rec)
	}
	return rec
}
