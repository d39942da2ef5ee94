package authz

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/pkg/tenancy"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// Lookup finds the company of stored resources. A missing resource is the
// error the service answers for it (run_not_found, interaction_not_found).
type Lookup interface {
	// ResolveRun finds the run a caller names by the id its company chose
	// among the companies it may read (run ids are unique per company);
	// run_id_ambiguous when more than one has one and none is named.
	ResolveRun(ctx context.Context, ref store.RunRef) (store.ResolvedRun, error)
	InteractionCompany(ctx context.Context, id string) (string, error)
}

// Authorizer authenticates and authorizes calls (SPEC T1, T2).
type Authorizer struct {
	// Required: identities are required. Off, the executor runs in
	// loopback development mode: every call is admitted without one.
	Required bool
	// Tokens verifies bearer tokens; nil refuses them.
	Tokens *tenancy.Verifier
	// Lookup finds stored resources' companies.
	Lookup Lookup

	known companies
}

// MetadataKey carries a bearer token: "authorization: Bearer <JWT>".
const MetadataKey = "authorization"

type principalKey struct{}

type runKey struct{}

// resolvedRun is the run a call names, as the authorizer resolved it.
type resolvedRun struct {
	id, company string
	run         store.ResolvedRun
}

// RunOf is the run a run-addressed call names by id (and company, the
// request's company_id), as the authorizer resolved it before the handler
// (SPEC T2); false when it did not (loopback development mode, or another
// id).
func RunOf(ctx context.Context, id, company string) (store.ResolvedRun, bool) {
	r, ok := ctx.Value(runKey{}).(*resolvedRun)
	if !ok || r.id != id || r.company != company {
		return store.ResolvedRun{}, false
	}
	return r.run, true
}

// NewContext returns ctx carrying the call's principal.
func NewContext(ctx context.Context, p *tenancy.Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the call's principal; nil in loopback development
// mode (no identities).
func FromContext(ctx context.Context) *tenancy.Principal {
	p, _ := ctx.Value(principalKey{}).(*tenancy.Principal)
	return p
}

// Companies is the companies a list call may show: nil for every company
// (an operator, or loopback development mode).
func Companies(ctx context.Context) []string {
	p := FromContext(ctx)
	if p == nil || p.Operator {
		return nil
	}
	if c := p.Companies(); c != nil {
		return c
	}
	return []string{}
}

// Actor names the caller in audit records: the authenticated principal,
// or fallback in loopback development mode.
func Actor(ctx context.Context, fallback string) string {
	if p := FromContext(ctx); p != nil {
		return p.String()
	}
	return fallback
}

// Authenticate returns the call's principal: from a bearer token when one
// is sent, else from the verified client certificate (a tenancy URI SAN,
// or a tether service's identity: an executor forwarding a call acts as an
// operator, a gateway may register). nil without an identity.
func (a *Authorizer) Authenticate(ctx context.Context) (*tenancy.Principal, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if vals := md.Get(MetadataKey); len(vals) > 0 {
			return a.token(vals)
		}
	}
	cert := peerCertificate(ctx)
	if cert == nil {
		return nil, nil
	}
	p, err := tenancy.FromCertificate(cert)
	if err != nil {
		return nil, unauthenticated("the client certificate: %v", err)
	}
	if p != nil {
		return p, nil
	}
	roles := identity.RolesOf(cert)
	switch {
	case slices.Contains(roles, identity.Executor):
		return &tenancy.Principal{Name: identity.Executor, Source: tenancy.SourceService, Operator: true}, nil
	case slices.Contains(roles, identity.Gateway):
		return &tenancy.Principal{Name: identity.Gateway, Source: tenancy.SourceService}, nil
	}
	return nil, nil
}

func (a *Authorizer) token(vals []string) (*tenancy.Principal, error) {
	if len(vals) != 1 {
		return nil, unauthenticated("send one authorization header")
	}
	raw, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok {
		return nil, unauthenticated("the authorization header must be \"Bearer <token>\"")
	}
	if a.Tokens == nil {
		return nil, unauthenticated("this executor accepts no bearer tokens (no -auth-jwks); present a client certificate")
	}
	p, err := a.Tokens.Verify(strings.TrimSpace(raw))
	if err != nil {
		return nil, unauthenticated("bearer token: %v", err)
	}
	return p, nil
}

func peerCertificate(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0][0]
}

func unauthenticated(format string, args ...any) error {
	return failure.New(codes.Unauthenticated, failure.CallerUnauthenticated, format, args...)
}

func notAuthorized(p *tenancy.Principal, method string, need tenancy.Role, company string) error {
	what := string(need)
	if company != "" {
		what += " of company " + company
	}
	return failure.New(codes.PermissionDenied, failure.CallerNotAuthorized, "%s may not call %s (needs %s)", p, method, what)
}

// Authorize checks a call of method with request req (after
// authentication) and returns ctx carrying the principal.
func (a *Authorizer) Authorize(ctx context.Context, method string, req any) (context.Context, error) {
	if !a.Required || !public(method) {
		return ctx, nil
	}
	rule, ok := Rules[method]
	if !ok {
		return nil, failure.New(codes.PermissionDenied, failure.CallerNotAuthorized, "%s has no authorization rule", method)
	}
	p, err := a.Authenticate(ctx)
	if err != nil {
		return nil, err
	}
	if p == nil && rule.Scope == ScopeGateway && hasMetadata(ctx, identity.RegistrationHeader) {
		// A gateway without a certificate: the registry's handler checks
		// its proof of the registration secret (SPEC T5).
		return ctx, nil
	}
	if p == nil {
		return nil, unauthenticated("%s needs an identity: a bearer token (authorization: Bearer <JWT>) or a client certificate naming a principal", method)
	}
	ctx, err = a.check(ctx, p, method, rule, req)
	if err != nil {
		return nil, err
	}
	return NewContext(ctx, p), nil
}

func (a *Authorizer) check(ctx context.Context, p *tenancy.Principal, method string, rule Rule, req any) (context.Context, error) {
	switch rule.Scope {
	case ScopeRequest:
		if c := rule.Company(req); !p.Can(c, rule.Need) {
			return nil, notAuthorized(p, method, rule.Need, c)
		}
	case ScopeRun:
		id, hint := req.(interface{ GetRunId() string }).GetRunId(), companyField(req)
		var run store.ResolvedRun
		err := a.stored(p, method, rule, func() (string, error) {
			var err error
			run, err = a.resolveRun(ctx, p, id, hint)
			return run.Company, err
		}, func() error { return store.ErrRunNotFound(id) })
		if err != nil {
			return nil, err
		}
		// The handler acts on the run resolved here (SPEC T2).
		return context.WithValue(ctx, runKey{}, &resolvedRun{id: id, company: hint, run: run}), nil
	case ScopeInteraction:
		id := req.(interface{ GetInteractionId() string }).GetInteractionId()
		return ctx, a.stored(p, method, rule, func() (string, error) {
			r, err := a.known.get(ctx, "interaction/"+id, func(ctx context.Context) (store.ResolvedRun, error) {
				c, err := a.Lookup.InteractionCompany(ctx, id)
				return store.ResolvedRun{Company: c}, err
			})
			return r.Company, err
		},
			func() error { return store.ErrInteractionNotFound(id) })
	case ScopeList:
		if !p.Operator && !slices.ContainsFunc(p.Companies(), func(c string) bool { return p.Can(c, rule.Need) }) {
			return nil, notAuthorized(p, method, rule.Need, "")
		}
	case ScopeFleet:
		if !p.Operator {
			return nil, notAuthorized(p, method, tenancy.Operator, "")
		}
	case ScopeGateway:
		if !p.Operator && !(p.Source == tenancy.SourceService && p.Name == identity.Gateway) {
			return nil, notAuthorized(p, method, "the runnergw identity or operator", "")
		}
	default:
		return nil, failure.New(codes.PermissionDenied, failure.CallerNotAuthorized, "%s has no valid rule", method)
	}
	return ctx, nil
}

// resolveRun finds the run p names by id (and company hint) among the
// companies it can read: run ids are unique per company (SPEC T2), so the
// same id may name a run of each. A company p cannot read is not looked
// at (its run answers as a missing one); more than one run is
// run_id_ambiguous, unless a company is named. A resolution that cannot
// change (one company, or one named) is remembered.
func (a *Authorizer) resolveRun(ctx context.Context, p *tenancy.Principal, id, hint string) (store.ResolvedRun, error) {
	ref := store.RunRef{ID: id, Company: hint}
	if !p.Operator {
		ref.Companies = []string{}
		for _, c := range p.Companies() {
			if p.Can(c, tenancy.Reader) {
				ref.Companies = append(ref.Companies, c)
			}
		}
		if hint != "" && !slices.Contains(ref.Companies, hint) {
			return store.ResolvedRun{}, store.ErrRunNotFound(id)
		}
	}
	lookup := func(ctx context.Context) (store.ResolvedRun, error) { return a.Lookup.ResolveRun(ctx, ref) }
	switch {
	case hint != "":
		return a.known.get(ctx, "run/"+hint+"\x00"+id, lookup)
	case len(ref.Companies) == 1:
		return a.known.get(ctx, "run/"+ref.Companies[0]+"\x00"+id, lookup)
	}
	return lookup(ctx)
}

// stored authorizes a call on a stored resource: one the caller cannot
// read answers exactly as a missing one (missing, the error the lookup
// gives for an unknown id), one it can read but not change is
// caller_not_authorized.
func (a *Authorizer) stored(p *tenancy.Principal, method string, rule Rule, company func() (string, error), missing func() error) error {
	c, err := company()
	if err != nil {
		return err
	}
	if !p.Can(c, tenancy.Reader) {
		return missing()
	}
	if !p.Can(c, rule.Need) {
		return notAuthorized(p, method, rule.Need, c)
	}
	return nil
}

// public reports whether method belongs to a service Rules covers (health
// and reflection are open to every caller the transport admitted).
func public(method string) bool {
	for _, s := range Services {
		if strings.HasPrefix(method, "/"+s+"/") {
			return true
		}
	}
	return false
}

// Unary is the unary server interceptor.
func (a *Authorizer) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := a.Authorize(ctx, info.FullMethod, req)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// Stream is the stream server interceptor: a server-streaming call is
// authorized when its request is received, before the handler sees it.
func (a *Authorizer) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !a.Required || !public(info.FullMethod) {
		return handler(srv, ss)
	}
	return handler(srv, &authorizedStream{ServerStream: ss, a: a, method: info.FullMethod, ctx: ss.Context()})
}

type authorizedStream struct {
	grpc.ServerStream
	a      *Authorizer
	method string
	ctx    context.Context
	done   bool
}

func (s *authorizedStream) Context() context.Context { return s.ctx }

func (s *authorizedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.done {
		return nil
	}
	ctx, err := s.a.Authorize(s.ctx, s.method, m)
	if err != nil {
		return err
	}
	s.ctx, s.done = ctx, true
	return nil
}

// Settings are the executor's authentication settings.
type Settings struct {
	// JWKSFile holds the public keys bearer tokens are verified against.
	JWKSFile string
	// Issuer and Audience a token must carry (pkg/tenancy defaults when
	// empty).
	Issuer, Audience string
	// HTTPAddr is the address of the executor's HTTP port (-http-addr,
	// SPEC U3), "" when it serves none: its calls reach the same
	// interceptors, so off loopback it requires identities as the gRPC
	// port does.
	HTTPAddr string
}

// New builds the Authorizer of a server listening at grpcAddr with TLS
// settings tlsCert/tlsClientCA: identities are required unless the server
// listens on loopback without any authentication configured (loopback
// development mode). Off loopback an executor without an authentication
// configuration (tokens or client certificates) is refused, and so is TLS
// without -tls-client-ca where identities are required (the service
// identities of gateways and executor replicas are certificates).
func New(grpcAddr, tlsCert, tlsClientCA string, s Settings, lookup Lookup) (*Authorizer, error) {
	certs := tlsClientCA != ""
	tokens := s.JWKSFile != ""
	offLoopback := ""
	switch {
	case !grpcx.IsLoopbackAddr(grpcAddr):
		offLoopback = grpcAddr
	case s.HTTPAddr != "" && !grpcx.IsLoopbackAddr(s.HTTPAddr):
		offLoopback = s.HTTPAddr + ", -http-addr"
	}
	required := certs || tokens || offLoopback != ""
	switch {
	case required && !certs && !tokens:
		return nil, fmt.Errorf("authz: the executor listens off loopback (%s) and so requires caller identities: "+
			"set -auth-jwks (bearer tokens) and/or -tls-client-ca (client certificates naming principals); see docs/security.md#tenancy", offLoopback)
	case required && tlsCert != "" && !certs:
		return nil, errors.New("authz: identities are required and TLS is on: set -tls-client-ca so that client certificates (gateways, executor replicas, principals) are verified")
	}
	a := &Authorizer{Required: required, Lookup: lookup}
	if tokens {
		v, err := tenancy.LoadVerifier(s.JWKSFile, s.Issuer, s.Audience, nil)
		if err != nil {
			return nil, err
		}
		a.Tokens = v
	}
	return a, nil
}

// Mode describes the authorizer for the startup log.
func (a *Authorizer) Mode() string {
	switch {
	case !a.Required:
		return "loopback development (no identities)"
	case a.Tokens != nil:
		return "tenancy (bearer tokens and client certificates)"
	}
	return "tenancy (client certificates)"
}

func hasMetadata(ctx context.Context, key string) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(key)) > 0
}
