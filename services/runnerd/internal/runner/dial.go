package runner

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/tether-run/tether/pkg/prp"
)

// TransportModes lists the modes this build supports.
var TransportModes = []string{prp.ModeDialWSLoopback, prp.ModeDialWSS, prp.ModeListenWS}

// maxCABundleBytes bounds --ca-bundle-path.
const maxCABundleBytes = 4 << 20

// gatewayDialer dials the gateway's WebSocket URL: ws:// whose host resolves
// to loopback addresses only (dial_ws_loopback), or wss:// to any address
// with the system roots plus an optional private CA bundle (dial_wss). The
// host is resolved once at startup and every later connection uses the
// pinned addresses.
type gatewayDialer struct {
	url   string
	mode  string
	addrs []string // host:port, pinned
	tls   *tls.Config
}

// validateWSURL applies the URL rules shared by both dial modes.
func validateWSURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("connect url: %w", err)
	}
	if u.Scheme != "ws" && u.Scheme != "wss" {
		return nil, fmt.Errorf("connect url: needs ws:// (dial_ws_loopback) or wss:// (dial_wss), got %q", u.Scheme)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" || strings.ContainsAny(raw, "\\% \t\r\n") {
		return nil, errors.New("connect url: userinfo, query, fragment, escapes and whitespace are not allowed")
	}
	if u.Hostname() == "" {
		return nil, errors.New("connect url: no host")
	}
	if strings.Contains(u.Hostname(), ":") && !strings.HasPrefix(u.Host, "[") {
		return nil, errors.New("connect url: IPv6 hosts must be bracketed")
	}
	if u.Port() == "0" {
		return nil, errors.New("connect url: port must be non-zero")
	}
	return u, nil
}

func newGatewayDialer(ctx context.Context, raw, caBundle string) (*gatewayDialer, error) {
	u, err := validateWSURL(raw)
	if err != nil {
		return nil, err
	}
	d := &gatewayDialer{url: raw, mode: prp.ModeDialWSLoopback}
	port := u.Port()
	if u.Scheme == "wss" {
		d.mode = prp.ModeDialWSS
		if port == "" {
			port = "443"
		}
		roots, err := x509.SystemCertPool()
		if err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		if caBundle != "" {
			if err := addCABundle(roots, caBundle); err != nil {
				return nil, err
			}
		}
		d.tls = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: u.Hostname()}
	} else {
		if caBundle != "" {
			return nil, errors.New("--ca-bundle-path is only valid with a wss:// connect url")
		}
		if port == "" {
			port = "80"
		}
	}
	host := u.Hostname()
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
	for _, ip := range ips {
		if d.mode == prp.ModeDialWSLoopback && !ip.IsLoopback() {
			return nil, fmt.Errorf("connect url: %q resolves to non-loopback address %s; use wss:// (dial_wss) off loopback", host, ip)
		}
		d.addrs = append(d.addrs, net.JoinHostPort(ip.String(), port))
	}
	return d, nil
}

// addCABundle adds the certificates of a private PEM file to pool. The file
// must be a regular file (not a symlink) owned by this user, not writable by
// group or others, at most 4 MiB, with at least one certificate.
func addCABundle(pool *x509.CertPool, path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("--ca-bundle-path: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("--ca-bundle-path %s is not a regular file", path)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("--ca-bundle-path %s must not be writable by group or others (mode %v)", path, fi.Mode().Perm())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("--ca-bundle-path %s is not owned by this user", path)
	}
	if fi.Size() > maxCABundleBytes {
		return fmt.Errorf("--ca-bundle-path %s exceeds %d bytes", path, maxCABundleBytes)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--ca-bundle-path: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCABundleBytes+1))
	if err != nil {
		return fmt.Errorf("--ca-bundle-path: %w", err)
	}
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return fmt.Errorf("--ca-bundle-path %s: %w", path, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return fmt.Errorf("--ca-bundle-path %s holds no PEM certificate", path)
	}
	return nil
}

// Dial opens a WebSocket to the pinned addresses (3 s per address, 10 s in
// all).
func (d *gatewayDialer) Dial(ctx context.Context) (*websocket.Conn, error) {
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
		TLSClientConfig:     d.tls,
		TLSHandshakeTimeout: 5 * time.Second,
		DisableCompression:  true,
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

// listenPathPrefix + runner id is the only path a listen_ws runner serves.
const listenPathPrefix = "/v1/runners/connect/"

// ListenPath is the path a listen_ws runner with runnerID serves.
func ListenPath(runnerID string) string { return listenPathPrefix + runnerID }

// isPrivateFile reports a regular, non-symlink file without group/other
// permission bits (for the listener's TLS key).
func isPrivateFile(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Mode().Perm()&fs.FileMode(0o077) != 0 {
		return fmt.Errorf("%s must not be accessible by group or others (mode %v)", path, fi.Mode().Perm())
	}
	return nil
}
