package runner

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// loopbackDialer dials a ws:// URL whose host resolved (once, at startup) to
// loopback addresses only; every later connection uses the pinned addresses.
type loopbackDialer struct {
	url   string
	addrs []string // host:port, pinned
}

func newLoopbackDialer(ctx context.Context, raw string) (*loopbackDialer, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("connect url: %w", err)
	}
	if u.Scheme != "ws" {
		return nil, fmt.Errorf("connect url: dial_ws_loopback needs a ws:// URL, got %q", u.Scheme)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(raw, "\\% \t\r\n") {
		return nil, errors.New("connect url: userinfo, query, fragment, escapes and whitespace are not allowed")
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "80"
	}
	if port == "0" {
		return nil, errors.New("connect url: port must be non-zero")
	}
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		res, err := net.DefaultResolver.LookupIPAddr(rctx, host)
		if err != nil {
			return nil, fmt.Errorf("connect url: resolve %q: %w", host, err)
		}
		for _, a := range res {
			ips = append(ips, a.IP)
		}
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("connect url: %q has no addresses", host)
	}
	d := &loopbackDialer{url: raw}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return nil, fmt.Errorf("connect url: %q resolves to non-loopback address %s", host, ip)
		}
		d.addrs = append(d.addrs, net.JoinHostPort(ip.String(), port))
	}
	return d, nil
}

// Dial opens a WebSocket to the pinned addresses (3 s per address).
func (d *loopbackDialer) Dial(ctx context.Context) (*websocket.Conn, error) {
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var lastErr error
			for _, a := range d.addrs {
				var nd net.Dialer
				actx, cancel := context.WithTimeout(ctx, 3*time.Second)
				c, err := nd.DialContext(actx, "tcp", a)
				cancel()
				if err == nil {
					return c, nil
				}
				lastErr = err
			}
			return nil, lastErr
		},
		DisableCompression: true,
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, d.url, &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	return ws, err
}
