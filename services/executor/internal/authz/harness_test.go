package authz_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tether-run/tether/pkg/devpki"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/pkg/tenancy"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/api"
	"github.com/tether-run/tether/services/executor/internal/authz"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/secrets"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/watch"
)

func TestMain(m *testing.M) { pgtest.MainCheckingLeaks(m) }

// Canaries: text only a company's own runs and interactions carry. A
// response to a caller must never hold another company's canary.
const (
	acmeCanary   = "ACME-CANARY-7f3a"
	globexCanary = "GLOBEX-CANARY-91bd"
	// secretCanary is the value of acme's secrets (SPEC T3): no response
	// to any caller ever holds it.
	secretCanary = "SECRET-CANARY-5c2e"
)

// env is an executor API (ExecutorService and GatewayRegistry) on real
// gRPC and PostgreSQL, behind the authorizer, with development tokens.
type env struct {
	t      testing.TB
	addr   string
	store  *store.Store
	minter *tenancy.Minter
	vault  *secrets.Vault
	pki    string // with mTLS: the development PKI
	mtls   bool

	mu      sync.Mutex
	reached map[string]int // calls that got past authorization, by method
}

type envOpts struct {
	// noAuth: loopback development mode (no JWKS, no client CA).
	noAuth bool
	// mtls: TLS with client certificates from a development PKI.
	mtls bool
	// registrationSecret: the registry's registration secret (SPEC T5).
	registrationSecret []byte
}

func newEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	dsn := pgtest.NewDB(t, pgtest.GooseMigrator(store.Migrations, "migrations", goose.WithTableName("executor_goose_version")))
	ctx, cancel := context.WithCancel(context.Background())
	st, err := store.Open(ctx, dsn, runrules.New())
	require.NoError(t, err)
	dir := t.TempDir()
	e := &env{t: t, store: st, reached: map[string]int{}, mtls: o.mtls}
	keyFile, jwks := filepath.Join(dir, tenancy.SigningKeyFile), filepath.Join(dir, tenancy.JWKSFile)
	require.NoError(t, tenancy.WriteSigningKey(keyFile, jwks))
	e.minter, err = tenancy.LoadMinter(keyFile)
	require.NoError(t, err)
	settings := authz.Settings{JWKSFile: jwks}
	if o.noAuth {
		settings = authz.Settings{}
	}
	cfg := grpcx.Config{Name: "executor", GRPCAddr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if o.mtls {
		e.pki = filepath.Join(dir, "pki")
		require.NoError(t, devpki.InitDev(e.pki, nil, 0))
		cfg.TLSCertFile, cfg.TLSKeyFile = devpki.CertFile(e.pki, identity.Executor), devpki.KeyFile(e.pki, identity.Executor)
		cfg.TLSClientCAFile = filepath.Join(e.pki, devpki.CAFile)
	}
	az, err := authz.New(cfg.GRPCAddr, cfg.TLSCertFile, cfg.TLSClientCAFile, settings, st)
	require.NoError(t, err)
	hub := watch.NewHub(st, watch.WithEncoder(api.EncodeWatchEvent))
	srv, err := grpcx.New(cfg, api.WatchCodec(),
		grpc.ChainUnaryInterceptor(az.Unary, e.recordUnary), grpc.ChainStreamInterceptor(az.Stream, e.recordStream))
	require.NoError(t, err)
	keys, err := secrets.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	e.vault = &secrets.Vault{Keys: keys, Store: st}
	executorv1.RegisterExecutorServiceServer(srv.GRPC(), &api.Server{Store: st, Hub: hub, Vault: e.vault})
	executorv1.RegisterGatewayRegistryServer(srv.GRPC(), &api.Registry{Store: st, Secret: o.registrationSecret})
	executorv1.RegisterCompaniesServer(srv.GRPC(), &api.Companies{Store: st})
	require.NoError(t, srv.Listen())
	e.addr = srv.Addr().String()
	served, listened := make(chan struct{}), make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ctx) }()
	go func() {
		defer close(listened)
		hub.Listen(ctx, st.Pool(), watch.Handlers{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	t.Cleanup(func() {
		cancel()
		<-served
		<-listened
		st.Close()
	})
	return e
}

// recordUnary and recordStream run after the authorizer: a call that
// reaches them was admitted.
func (e *env) recordUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	e.note(info.FullMethod)
	return h(ctx, req)
}

func (e *env) recordStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &noteOnRecv{ServerStream: ss, note: func() { e.note(info.FullMethod) }})
}

type noteOnRecv struct {
	grpc.ServerStream
	note func()
}

func (s *noteOnRecv) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.note()
	}
	return err
}

func (e *env) note(method string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reached[method]++
}

func (e *env) reachedCount(method string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reached[method]
}

// token mints a token for subject with grants.
func (e *env) token(subject string, grants ...string) string {
	tok, err := e.minter.Mint(subject, grants, time.Hour, time.Now())
	require.NoError(e.t, err)
	return tok
}

// dial connects with the given per-call options (e.g. a token).
func (e *env) dial(opts ...grpc.DialOption) *grpc.ClientConn {
	conn, err := grpcx.Dial(e.addr, "", opts...)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { conn.Close() })
	return conn
}

// as connects with a token for subject with grants; no grants: no identity.
func (e *env) as(subject string, grants ...string) *grpc.ClientConn {
	if len(grants) == 0 {
		return e.dial()
	}
	return e.dial(grpc.WithPerRPCCredentials(tenancy.Bearer(e.token(subject, grants...))))
}

// asCert connects over mTLS with a certificate named name carrying grants
// (none: the plain client certificate).
func (e *env) asCert(name string, grants ...string) *grpc.ClientConn {
	e.t.Helper()
	if len(grants) > 0 {
		uris, err := tenancy.GrantURIs(name, grants)
		require.NoError(e.t, err)
		require.NoError(e.t, devpki.IssueDev(e.pki, name, uris, 0))
	}
	tc, err := grpcx.ClientTLSConfig(filepath.Join(e.pki, devpki.CAFile), devpki.CertFile(e.pki, name), devpki.KeyFile(e.pki, name))
	require.NoError(e.t, err)
	tc.MinVersion = tls.VersionTLS12
	return e.dial(grpc.WithTransportCredentials(credentials.NewTLS(tc)))
}

func input(company, session, prompt string) *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"},
		Binding:  &prpv1.Binding{CompanyId: company, AgentId: "agent-1"},
		Task:     &prpv1.Task{Prompt: prompt},
		Session: &prpv1.Session{NormalizedSessionId: session,
			Lifecycle: &prpv1.Lifecycle{Mode: prpv1.LifecycleMode_LIFECYCLE_MODE_WARM}},
	}
}

// seed stores, as each company's writer, a run that has ended (cancelled
// while queued: a watch of it ends) and an interaction of it; it returns
// the interaction ids by company.
func (e *env) seed(ctx context.Context, conns map[string]*grpc.ClientConn) map[string]string {
	e.t.Helper()
	ids := map[string]string{}
	for company, canary := range map[string]string{"acme": acmeCanary, "globex": globexCanary} {
		c := executorv1.NewExecutorServiceClient(conns[company])
		run := company + "-run"
		// Each company's run names a secret and configures a plain value
		// (stored by reference): neither value is ever returned (SPEC T3).
		_, err := c.PutSecret(ctx, &executorv1.PutSecretRequest{CompanyId: company, Name: "api-key", Value: []byte(secretCanary)})
		require.NoError(e.t, err)
		in := input(company, "s-"+company, "task "+canary)
		in.Environment = &prpv1.ProviderEnvironment{SecretRefs: map[string]string{"OPENAI_API_KEY": "api-key"},
			Configured: map[string]string{"GIT_TOKEN": secretCanary + "-plain"}}
		_, err = c.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: run, Input: in})
		require.NoError(e.t, err)
		_, err = c.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: run, Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN, Reason: "seed"})
		require.NoError(e.t, err)
		id := "ia-" + company
		_, err = e.store.Pool().Exec(ctx, `INSERT INTO executor.interactions (interaction_id, idempotency_key, kind, source_run_id, company_id, title, continuation_policy, payload)
VALUES ($1, $1, 'ask_user_questions', $2, $3, $4, 'response_wake', '{"questions":[{"id":"q","prompt":"p","options":[{"id":"o","label":"l"}]}]}')`,
			id, run, company, "question "+canary)
		require.NoError(e.t, err)
		ids[company] = id
	}
	return ids
}
