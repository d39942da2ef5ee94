package authz_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/pkg/tenancy"
	"github.com/tether-run/tether/services/executor/internal/authz"
)

func seedBoth(t *testing.T, e *env) map[string]string {
	t.Helper()
	return e.seed(context.Background(), map[string]*grpc.ClientConn{
		"acme": e.as("seed-a", "acme:writer"), "globex": e.as("seed-g", "globex:writer")})
}

// TestT1_BearerTokensNamePrincipalsAndBadOnesAreUnauthenticated: a token
// signed by a JWKS key is the caller's identity; an expired token, one
// signed by another key, a malformed one, another scheme or none at all
// is Unauthenticated caller_unauthenticated and reaches no handler.
func TestT1_BearerTokensNamePrincipalsAndBadOnesAreUnauthenticated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	seedBoth(t, e)
	ctx := context.Background()
	got, err := executorv1.NewExecutorServiceClient(e.as("alice", "acme:writer")).GetRun(ctx, &executorv1.GetRunRequest{RunId: "acme-run"})
	require.NoError(t, err)
	require.Equal(t, "acme", got.GetRun().GetInput().GetBinding().GetCompanyId())

	expired, err := e.minter.Mint("alice", []string{"acme:writer"}, time.Hour, time.Now().Add(-3*time.Hour))
	require.NoError(t, err)
	otherDir := t.TempDir()
	require.NoError(t, tenancy.WriteSigningKey(filepath.Join(otherDir, "k"), filepath.Join(otherDir, "j")))
	other, err := tenancy.LoadMinter(filepath.Join(otherDir, "k"))
	require.NoError(t, err)
	forged, err := other.Mint("alice", []string{"operator"}, time.Hour, time.Now())
	require.NoError(t, err)
	valid := e.token("alice", "acme:writer")
	bad := map[string][]string{
		"no identity":        nil,
		"expired":            {"authorization", "Bearer " + expired},
		"another key":        {"authorization", "Bearer " + forged},
		"malformed":          {"authorization", "Bearer not.a.jwt"},
		"another scheme":     {"authorization", "Basic " + valid},
		"tampered signature": {"authorization", "Bearer " + valid[:len(valid)-4] + "AAAA"},
	}
	client := executorv1.NewExecutorServiceClient(e.dial())
	for name, md := range bad {
		before := e.reachedCount(executorv1.ExecutorService_GetRun_FullMethodName)
		cctx := ctx
		if md != nil {
			cctx = metadata.AppendToOutgoingContext(ctx, md...)
		}
		_, err := client.GetRun(cctx, &executorv1.GetRunRequest{RunId: "acme-run"})
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%s: %v", name, err)
		require.EqualValues(t, failure.CallerUnauthenticated, failure.CodeOf(err), name)
		require.Equal(t, before, e.reachedCount(executorv1.ExecutorService_GetRun_FullMethodName), "%s reached the handler", name)
	}
}

// TestT1_ClientCertificatesNamePrincipals: over mTLS a certificate's
// tenancy URI SANs are the caller's identity; the plain client certificate
// (no principal) is Unauthenticated; an executor replica's certificate
// acts as an operator (forwarded calls), a gateway's may only register.
func TestT1_ClientCertificatesNamePrincipals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{mtls: true})
	ctx := context.Background()
	acme := executorv1.NewExecutorServiceClient(e.asCert("alice", "acme:writer"))
	globex := executorv1.NewExecutorServiceClient(e.asCert("gwen", "globex:writer"))
	_, err := acme.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "acme-run", Input: input("acme", "s", "hi")})
	require.NoError(t, err)
	_, err = globex.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "globex-run", Input: input("globex", "s", "hi")})
	require.NoError(t, err)

	_, err = acme.GetRun(ctx, &executorv1.GetRunRequest{RunId: "acme-run"})
	require.NoError(t, err)
	_, err = acme.GetRun(ctx, &executorv1.GetRunRequest{RunId: "globex-run"})
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	_, err = acme.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "x", Input: input("globex", "s", "hi")})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)

	for _, name := range []string{identity.Client, identity.BackupVerifier} {
		_, err = executorv1.NewExecutorServiceClient(e.asCert(name)).GetRun(ctx, &executorv1.GetRunRequest{RunId: "acme-run"})
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%s: %v", name, err)
	}
	// The runnergw service identity may register a gateway, and nothing
	// else; a company's principal may not register one.
	gw := executorv1.NewGatewayRegistryClient(e.asCert(identity.Gateway))
	reg := &executorv1.RegisterGatewayRequest{GatewayId: "gw-a", Address: "127.0.0.1:1", Capacity: 1}
	_, err = gw.RegisterGateway(ctx, reg)
	require.NoError(t, err)
	_, err = gw.ListGateways(ctx, &executorv1.ListGatewaysRequest{})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	_, err = executorv1.NewExecutorServiceClient(e.asCert(identity.Gateway)).GetRun(ctx, &executorv1.GetRunRequest{RunId: "acme-run"})
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	_, err = executorv1.NewGatewayRegistryClient(e.asCert("alice")).RegisterGateway(ctx, reg)
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	for name, grants := range map[string][]string{"olga": {"operator"}, identity.Executor: nil} {
		list, err := executorv1.NewExecutorServiceClient(e.asCert(name, grants...)).ListRuns(ctx, &executorv1.ListRunsRequest{})
		require.NoError(t, err, name)
		require.Len(t, list.GetRuns(), 2, "%s sees every company", name)
	}
}

// TestT1_OffLoopbackTheExecutorRefusesToStartWithoutAuthentication: the
// startup decision. Off loopback an authentication configuration is
// required; TLS without -tls-client-ca is refused where identities are
// required; loopback without configuration is development mode.
func TestT1_OffLoopbackTheExecutorRefusesToStartWithoutAuthentication(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	jwks := filepath.Join(dir, tenancy.JWKSFile)
	require.NoError(t, tenancy.WriteSigningKey(filepath.Join(dir, tenancy.SigningKeyFile), jwks))
	cases := []struct {
		name, addr, cert, clientCA, jwks string
		http                             string // -http-addr (SPEC U3)
		err                              string
		required                         bool
	}{
		{name: "loopback, nothing configured", addr: "127.0.0.1:7400"},
		{name: "loopback with tokens", addr: "127.0.0.1:7400", jwks: jwks, required: true},
		{name: "loopback with mTLS", addr: "127.0.0.1:7400", cert: "c", clientCA: "ca", required: true},
		{name: "off loopback, nothing", addr: "0.0.0.0:7400", err: "requires caller identities"},
		{name: "off loopback, TLS without client CA", addr: ":7400", cert: "c", err: "requires caller identities"},
		{name: "off loopback, tokens over TLS without client CA", addr: ":7400", cert: "c", jwks: jwks, err: "-tls-client-ca"},
		{name: "off loopback, tokens and mTLS", addr: ":7400", cert: "c", clientCA: "ca", jwks: jwks, required: true},
		{name: "off loopback, mTLS", addr: "10.0.0.1:7400", cert: "c", clientCA: "ca", required: true},
		{name: "loopback, HTTP port on loopback", addr: "127.0.0.1:7400", http: "127.0.0.1:7480"},
		{name: "loopback, HTTP port off loopback, nothing", addr: "127.0.0.1:7400", http: "0.0.0.0:7480", err: "requires caller identities"},
		{name: "loopback, HTTP port off loopback, tokens", addr: "127.0.0.1:7400", http: ":7480", jwks: jwks, required: true},
		{name: "unreadable JWKS", addr: "127.0.0.1:7400", jwks: filepath.Join(dir, "missing.json"), err: "missing.json"},
	}
	for _, c := range cases {
		a, err := authz.New(c.addr, c.cert, c.clientCA, authz.Settings{JWKSFile: c.jwks, HTTPAddr: c.http}, nil)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.name)
			continue
		}
		require.NoError(t, err, c.name)
		require.Equal(t, c.required, a.Required, c.name)
	}
}

// TestT1_LoopbackDevelopmentModeNeedsNoIdentity: on loopback without an
// authentication configuration every call is admitted, as before tenancy
// (make demo, make up, make test stay zero-config).
func TestT1_LoopbackDevelopmentModeNeedsNoIdentity(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{noAuth: true})
	ctx := context.Background()
	c := executorv1.NewExecutorServiceClient(e.dial())
	_, err := c.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "r1", Input: input("acme", "s", "hi")})
	require.NoError(t, err)
	_, err = c.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "r2", Input: input("globex", "s", "hi")})
	require.NoError(t, err)
	list, err := c.ListRuns(ctx, &executorv1.ListRunsRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetRuns(), 2)
	_, err = executorv1.NewGatewayRegistryClient(e.dial()).ListGateways(ctx, &executorv1.ListGatewaysRequest{})
	require.NoError(t, err)
}

// TestT2_AnotherCompanysResourceAnswersExactlyAsAMissingOne: a run or
// interaction of another company answers with the very status (code,
// message, details) a missing one does, for reads and writes alike.
func TestT2_AnotherCompanysResourceAnswersExactlyAsAMissingOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	ia := seedBoth(t, e)
	ctx := context.Background()
	conn := e.as("gwen", "globex:writer")
	c := executorv1.NewExecutorServiceClient(conn)
	probes := map[string]func(id string) error{
		"GetRun": func(id string) error { _, err := c.GetRun(ctx, &executorv1.GetRunRequest{RunId: id}); return err },
		"CancelRun": func(id string) error {
			_, err := c.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: id, Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN})
			return err
		},
		"SteerRun": func(id string) error {
			_, err := c.SteerRun(ctx, &executorv1.SteerRunRequest{RunId: id, Message: "attacker steering text"})
			return err
		},
		"WatchRun": func(id string) error {
			s, err := c.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: id})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		},
	}
	for name, probe := range probes {
		foreign, missing := probe("acme-run"), probe("nope-run")
		require.Equal(t, codes.NotFound, status.Code(foreign), "%s: %v", name, foreign)
		require.Equal(t, sanitized(missing, "nope-run"), sanitized(foreign, "acme-run"), name)
	}
	ip := map[string]func(id string) error{
		"GetInteraction": func(id string) error {
			_, err := c.GetInteraction(ctx, &executorv1.GetInteractionRequest{InteractionId: id})
			return err
		},
		"AnswerInteraction": func(id string) error {
			_, err := c.AnswerInteraction(ctx, &executorv1.AnswerInteractionRequest{InteractionId: id,
				Answers: []*executorv1.InteractionAnswer{{QuestionId: "q", OptionIds: []string{"o"}}}})
			return err
		},
	}
	for name, probe := range ip {
		foreign, missing := probe(ia["acme"]), probe("ia-nope")
		require.Equal(t, codes.NotFound, status.Code(foreign), "%s: %v", name, foreign)
		require.Equal(t, sanitized(missing, "ia-nope"), sanitized(foreign, ia["acme"]), name)
	}
}

// sanitized is an error's full status with the resource id replaced.
func sanitized(err error, id string) string {
	return strings.ReplaceAll(prototext.Format(status.Convert(err).Proto()), id, "ID")
}

// TestT2_ListsReturnOnlyTheCallersCompanies: ListRuns and ListInteractions
// show a principal only its companies' runs and interactions; an operator
// sees all.
func TestT2_ListsReturnOnlyTheCallersCompanies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	seedBoth(t, e)
	ctx := context.Background()
	cases := map[string]struct {
		grants []string
		want   []string
	}{
		"acme reader":    {[]string{"acme:reader"}, []string{"acme"}},
		"globex writer":  {[]string{"globex:writer"}, []string{"globex"}},
		"both companies": {[]string{"acme:reader", "globex:reader"}, []string{"acme", "globex"}},
		"other company":  {[]string{"initech:writer"}, nil},
		"an operator":    {[]string{"operator"}, []string{"acme", "globex"}},
	}
	for name, cs := range cases {
		c := executorv1.NewExecutorServiceClient(e.as("p", cs.grants...))
		runs, err := c.ListRuns(ctx, &executorv1.ListRunsRequest{})
		require.NoError(t, err, name)
		var got []string
		for _, r := range runs.GetRuns() {
			got = append(got, r.GetInput().GetBinding().GetCompanyId())
		}
		require.ElementsMatch(t, cs.want, got, "%s: runs", name)
		ias, err := c.ListInteractions(ctx, &executorv1.ListInteractionsRequest{})
		require.NoError(t, err, name)
		got = nil
		for _, i := range ias.GetInteractions() {
			got = append(got, i.GetCompanyId())
		}
		require.ElementsMatch(t, cs.want, got, "%s: interactions", name)
		// A filter naming another company's run finds nothing either.
		ias, err = c.ListInteractions(ctx, &executorv1.ListInteractionsRequest{RunId: "acme-run"})
		require.NoError(t, err, name)
		require.Equal(t, len(ias.GetInteractions()) == 1, contains(cs.want, "acme"), name)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestT2_ResubmittingAnotherCompanysRunIDIsNoOracle: the probe
// (resubmit a victim's run id with a guessed input: created:false on a
// right guess, run_id_conflict on a wrong one) learns nothing. Under the
// victim's company it is refused before any run is read, whatever the
// guess. Under the caller's own company run ids are the company's own
// (unique per company): the victim's id answers exactly as an id nobody
// used (created, then idempotent, then run_id_conflict against the
// caller's own run), and the victim's run is untouched.
func TestT2_ResubmittingAnotherCompanysRunIDIsNoOracle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	seedBoth(t, e)
	ctx := context.Background()
	c := executorv1.NewExecutorServiceClient(e.as("gwen", "globex:writer"))
	right, wrong := "task "+acmeCanary, "a wrong guess"
	var answers []string
	for _, prompt := range []string{right, wrong} {
		resp, err := c.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "acme-run", Input: input("acme", "s-acme", prompt)})
		require.Error(t, err, "%v", resp)
		answers = append(answers, sanitized(err, prompt))
	}
	require.Equal(t, answers[0], answers[1], "as company acme the answer tells the guess")
	require.NotContains(t, answers[0], acmeCanary)

	probe := func(id string) []string {
		var out []string
		for _, prompt := range []string{right, right, wrong} {
			resp, err := c.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: id, Input: input("globex", "s-probe-"+id, prompt)})
			out = append(out, fmt.Sprintf("created=%v run=%s code=%s %s", resp.GetCreated(),
				strings.ReplaceAll(resp.GetRun().GetRunId(), id, "ID"), status.Code(err), strings.ReplaceAll(sanitized(err, prompt), id, "ID")))
			require.NotContains(t, protojson.Format(resp), "acme\"", "nothing of acme's run")
		}
		return out
	}
	victims, nobodys := probe("acme-run"), probe("nobodys-run")
	require.Equal(t, nobodys, victims, "another company's run id answers as an unused one")
	require.True(t, strings.HasPrefix(victims[0], "created=true run=ID code=OK"), victims[0])
	require.Contains(t, victims[2], "run_id_conflict")
	// The victim's run is untouched, and still acme's only.
	run, err := executorv1.NewExecutorServiceClient(e.as("alice", "acme:reader")).GetRun(ctx, &executorv1.GetRunRequest{RunId: "acme-run"})
	require.NoError(t, err)
	require.Equal(t, "acme", run.GetRun().GetInput().GetBinding().GetCompanyId())
	require.Contains(t, run.GetRun().GetInput().GetTask().GetPrompt(), acmeCanary)
}

// TestT2_AuditAndRequestedByRecordTheAuthenticatedPrincipal: a
// cancellation's audit entries name the principal that asked (not "api"),
// and a ReplaceSession decision records the operator's identity, not the
// requested_by the caller wrote.
func TestT2_AuditAndRequestedByRecordTheAuthenticatedPrincipal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	alice := executorv1.NewExecutorServiceClient(e.as("alice", "acme:writer"))
	_, err := alice.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "r1", Input: input("acme", "s1", "hi")})
	require.NoError(t, err)
	_, err = alice.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: "r1", Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN})
	require.NoError(t, err)
	acts, err := e.store.Activities(ctx, "r1")
	require.NoError(t, err)
	require.NotEmpty(t, acts)
	for _, a := range acts {
		require.Equal(t, "token:alice", a.Actor, a.Action)
	}
	_, err = alice.ReplaceSession(ctx, &executorv1.ReplaceSessionRequest{CompanyId: "acme", NormalizedSessionId: "s1", RequestedBy: "alice", Reason: "r"})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "session replacement is an operator's: %v", err)
	rp, err := executorv1.NewExecutorServiceClient(e.as("olga", "operator")).ReplaceSession(ctx,
		&executorv1.ReplaceSessionRequest{CompanyId: "acme", NormalizedSessionId: "s1", RequestedBy: "mallory", Reason: "lost"})
	require.NoError(t, err)
	require.Len(t, rp.GetReplacements(), 1)
	require.Equal(t, "token:olga", rp.GetReplacements()[0].GetRequestedBy())
	require.Equal(t, "token:olga", rp.GetReplacements()[0].GetCaller())
}

// TestT2_SubmitAnswerAndDrainRecordTheAuthenticatedPrincipal: the run
// names the principal that submitted it, the interaction the one whose
// answer completed it (and its continuation run names that one as its
// submitter), and a gateway's drain the operator that asked; none of them
// is text the caller wrote.
func TestT2_SubmitAnswerAndDrainRecordTheAuthenticatedPrincipal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	ia := e.seed(ctx, map[string]*grpc.ClientConn{"acme": e.as("alice", "acme:writer"), "globex": e.as("gary", "globex:writer")})
	bob := executorv1.NewExecutorServiceClient(e.as("bob", "acme:writer"))
	run, err := bob.GetRun(ctx, &executorv1.GetRunRequest{RunId: "acme-run"})
	require.NoError(t, err)
	require.Equal(t, "token:alice", run.GetRun().GetSubmittedBy())

	ans, err := bob.AnswerInteraction(ctx, &executorv1.AnswerInteractionRequest{InteractionId: ia["acme"],
		Answers: []*executorv1.InteractionAnswer{{QuestionId: "q", OptionIds: []string{"o"}}}})
	require.NoError(t, err)
	require.Equal(t, "token:bob", ans.GetInteraction().GetAnsweredBy())
	require.Equal(t, "token:bob", ans.GetContinuationRun().GetSubmittedBy())
	got, err := bob.GetInteraction(ctx, &executorv1.GetInteractionRequest{InteractionId: ia["acme"]})
	require.NoError(t, err)
	require.Equal(t, "token:bob", got.GetInteraction().GetAnsweredBy())

	olga := executorv1.NewGatewayRegistryClient(e.as("olga", "operator"))
	_, err = olga.RegisterGateway(ctx, &executorv1.RegisterGatewayRequest{GatewayId: "gw-a", Address: "127.0.0.1:1", Capacity: 1})
	require.NoError(t, err)
	dr, err := olga.DrainGateway(ctx, &executorv1.DrainGatewayRequest{GatewayId: "gw-a", Reason: "maintenance"})
	require.NoError(t, err)
	require.Equal(t, "token:olga", dr.GetGateway().GetDrain().GetRequestedBy())
	list, err := olga.ListGateways(ctx, &executorv1.ListGatewaysRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetGateways(), 1)
	require.Equal(t, "token:olga", list.GetGateways()[0].GetDrain().GetRequestedBy())
}

// TestT2_AGatewayWithoutACertificateRegistersOnlyWithTheRegistrationProof:
// where identities are required, RegisterGateway without an identity is
// refused before the registry unless it carries a registration proof, which
// the registry then checks against its secret (SPEC T5).
func TestT2_AGatewayWithoutACertificateRegistersOnlyWithTheRegistrationProof(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef0123456789abcdef")
	e := newEnv(t, envOpts{registrationSecret: secret})
	ctx := context.Background()
	reg := executorv1.NewGatewayRegistryClient(e.dial())
	req := &executorv1.RegisterGatewayRequest{GatewayId: "gw-a", Address: "127.0.0.1:1", Capacity: 1}
	_, err := reg.RegisterGateway(ctx, req)
	require.EqualValues(t, failure.CallerUnauthenticated, failure.CodeOf(err), "%v", err)
	_, err = reg.RegisterGateway(identity.WithRegistrationProof(ctx, []byte("another secret, also 32 bytes..")), req)
	require.EqualValues(t, failure.GatewayRegistrationUnauthenticated, failure.CodeOf(err), "%v", err)
	_, err = reg.RegisterGateway(identity.WithRegistrationProof(ctx, secret), req)
	require.NoError(t, err)
	// The proof admits a registration only.
	_, err = reg.ListGateways(identity.WithRegistrationProof(ctx, secret), &executorv1.ListGatewaysRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
}
