package grpcx

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/tether-run/tether/pkg/envflag"
)

// httpAPI is the optional HTTP listener a service serves beside gRPC
// (AddHTTP): the executor's browser access (SPEC U3).
type httpAPI struct {
	addr    string
	handler http.Handler
	lis     net.Listener
	srv     *http.Server
}

// AddHTTP has the server also serve h on addr (HTTP/1.1 and HTTP/2), from
// Listen/Serve until shutdown, with the gRPC port's rules: TLS with the
// same certificate when -tls-cert is set, refused off loopback in
// plaintext unless AllowPlaintext. With -tls-client-ca a client
// certificate is verified when one is presented but not required (a
// browser seldom has one): the handler's calls then reach the same
// interceptors, which authenticate the caller by its bearer token or its
// verified certificate. Call it before Listen or Serve.
func (s *Server) AddHTTP(addr string, h http.Handler) error {
	if addr == "" {
		return errors.New("grpcx: AddHTTP: no address")
	}
	if !s.secure && !s.cfg.AllowPlaintext && !IsLoopbackAddr(addr) {
		return fmt.Errorf("grpcx: refusing to serve plaintext HTTP on non-loopback address %q: configure -tls-cert and -tls-key, or set -insecure-allow-plaintext (%s=true)", addr, envflag.EnvName("insecure-allow-plaintext"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.served || s.http != nil {
		return errors.New("grpcx: AddHTTP after Serve, or twice")
	}
	s.http = &httpAPI{addr: addr, handler: h}
	return nil
}

// HTTPAddr is the bound address of the AddHTTP listener (nil before
// Listen / Serve, or without one).
func (s *Server) HTTPAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.http == nil || s.http.lis == nil {
		return nil
	}
	return s.http.lis.Addr()
}

func (s *Server) listenHTTPLocked() error {
	if s.http == nil || s.http.lis != nil {
		return nil
	}
	lis, err := net.Listen("tcp", s.http.addr)
	if err != nil {
		return fmt.Errorf("grpcx: http: %w", err)
	}
	s.http.lis = lis
	return nil
}

// startHTTP serves the AddHTTP listener (if any); errs receives a serving
// error.
func (s *Server) startHTTP(errs chan<- error, done func()) bool {
	s.mu.Lock()
	api := s.http
	s.mu.Unlock()
	if api == nil || api.lis == nil {
		return false
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true)
	// gRPC clients (prior-knowledge HTTP/2) reach the port in plaintext on
	// loopback too.
	protocols.SetUnencryptedHTTP2(s.tls == nil)
	api.srv = &http.Server{
		Handler:           api.handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		Protocols:         &protocols,
		MaxHeaderBytes:    1 << 20,
	}
	if s.tls != nil {
		tc := s.tls.Clone()
		if tc.ClientAuth == tls.RequireAndVerifyClientCert {
			tc.ClientAuth = tls.VerifyClientCertIfGiven
		}
		api.srv.TLSConfig = tc
	}
	go func() {
		defer done()
		var err error
		if api.srv.TLSConfig != nil {
			err = api.srv.ServeTLS(api.lis, "", "")
		} else {
			err = api.srv.Serve(api.lis)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- err
		}
	}()
	return true
}

// stopHTTP shuts the HTTP listener down before gRPC's graceful stop (which
// would cut the calls it carries): in-flight calls finish, long streams end
// on Draining, until deadline; then it is closed.
func (s *Server) stopHTTP(deadline time.Time) {
	s.mu.Lock()
	api := s.http
	s.mu.Unlock()
	if api == nil || api.srv == nil {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := api.srv.Shutdown(ctx); err != nil {
		api.srv.Close()
	}
}

func (s *Server) closeHTTPListenerLocked() {
	if s.http != nil && s.http.lis != nil {
		s.http.lis.Close()
	}
}
