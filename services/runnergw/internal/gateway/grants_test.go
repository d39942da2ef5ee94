package gateway

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/scope/durable"
)

const testGatewayID = "gw-test"

// testFleetKey is the executor fleet of the gateway tests; the relays'
// gateways verify with its public key (testGrants.verifier) and their
// clients sign with it (testGrants.signer).
var testFleetPub, testFleetKey, _ = ed25519.GenerateKey(nil)

var testGrants = struct {
	signer   *grant.Signer
	verifier *grant.Verifier
}{signer: grant.NewSigner(testFleetKey, 0, nil), verifier: mustVerifier(testFleetPub)}

func mustVerifier(pub ed25519.PublicKey) *grant.Verifier {
	v, err := grant.NewVerifier(testGatewayID, []ed25519.PublicKey{pub}, nil)
	if err != nil {
		panic(err)
	}
	return v
}

func (s server) CloseRunner(ctx context.Context, req *gatewayv1.CloseRunnerRequest) (*gatewayv1.CloseRunnerResponse, error) {
	return s.g.CloseRunner(ctx, req)
}

func (s server) ListRunners(ctx context.Context, _ *gatewayv1.ListRunnersRequest) (*gatewayv1.ListRunnersResponse, error) {
	rs, err := s.g.ListRunners(ctx)
	if err != nil {
		return nil, err
	}
	return &gatewayv1.ListRunnersResponse{Runners: rs}, nil
}

func (s server) GetRunner(ctx context.Context, req *gatewayv1.GetRunnerRequest) (*gatewayv1.GetRunnerResponse, error) {
	r, err := s.g.GetRunner(ctx, req.GetRunnerInstanceId())
	if err != nil {
		return nil, err
	}
	return &gatewayv1.GetRunnerResponse{Runner: r}, nil
}

// sign mints a grant with signer (at now) for claims.
func sign(t *testing.T, key ed25519.PrivateKey, now time.Time, c grant.Claims) string {
	t.Helper()
	tok, err := grant.NewSigner(key, time.Minute, func() time.Time { return now }).Sign(c)
	require.NoError(t, err)
	return tok
}

func requireGrantRefused(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.EqualValues(t, failure.GatewayGrantInvalid, failure.CodeOf(err), "%v", err)
}

// TestS1_ForgedAttachesAreRefusedAndLeaveNoFenceRunnerOrProcess: each
// forged Attach of a victim run is refused before the gateway fences, looks
// at or launches anything; the genuine run then attaches at attempt 1 and
// completes its turn on the only runner and provider of its scope.
func TestS1_ForgedAttachesAreRefusedAndLeaveNoFenceRunnerOrProcess(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, otherKey, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	fleetKey := testFleetKey
	now := time.Now()
	const maxAttempt = math.MaxUint64
	cases := []struct {
		name    string
		attempt uint64 // the forged Open's attempt
		owner   string // the forged Open's owner (default the genuine one)
		grant   func(victim grant.Claims) string
	}{
		{"no grant", 1, "", func(grant.Claims) string { return "" }},
		{"garbage", 1, "", func(grant.Claims) string { return "tg1.0123456789abcdef.e30.AAAA" }},
		{"wrong key", 1, "", func(c grant.Claims) string { return sign(t, otherKey, now, c) }},
		{"other run", 1, "", func(c grant.Claims) string { c.RunID = "someone-else"; return sign(t, fleetKey, now, c) }},
		{"other scope", 1, "", func(c grant.Claims) string {
			c.Scope = scope.Of(testInput("elsewhere", "acme", "x"))
			return sign(t, fleetKey, now, c)
		}},
		{"other attempt", 2, "", func(c grant.Claims) string { return sign(t, fleetKey, now, c) }},
		{"other owner", 1, "evil", func(c grant.Claims) string { return sign(t, fleetKey, now, c) }},
		{"other gateway", 1, "", func(c grant.Claims) string { c.Audience = "gw-elsewhere"; return sign(t, fleetKey, now, c) }},
		{"other method", 1, "", func(c grant.Claims) string { c.Method = grant.MethodCloseRunner; return sign(t, fleetKey, now, c) }},
		{"expired", 1, "", func(c grant.Claims) string { return sign(t, fleetKey, now.Add(-2*time.Minute), c) }},
		{"attempt 2^64-1 without a grant", maxAttempt, "", func(grant.Claims) string { return "" }},
		{"attempt 2^64-1 with the grant of attempt 1", maxAttempt, "", func(c grant.Claims) string { return sign(t, fleetKey, now, c) }},
		{"attempt 2^64-1 signed by another key", maxAttempt, "", func(c grant.Claims) string {
			c.Attempt = maxAttempt
			return sign(t, otherKey, now, c)
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			runID := "victim-" + string(rune('a'+i))
			in := testInput("victim-session-"+string(rune('a'+i)), "acme", "the genuine prompt")
			sc := scope.OfRun(runID, in)
			genuine := &gatewayv1.Open{RunId: runID, Fence: &gatewayv1.FencingToken{Owner: "test", Attempt: 1}, Input: in}
			claims := grant.ClaimsForOpen(genuine)
			claims.Audience = testGatewayID

			actx := ctx
			if tok := tc.grant(claims); tok != "" {
				actx = metadata.AppendToOutgoingContext(ctx, grant.Header, tok)
			}
			s, err := rl.raw.Attach(actx)
			require.NoError(t, err)
			// The gateway may refuse before it reads the Open: Send then
			// sees the stream end (io.EOF) and Recv the refusal.
			if err := s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: &gatewayv1.Open{
				RunId: runID, Fence: &gatewayv1.FencingToken{Owner: cmp.Or(tc.owner, "test"), Attempt: tc.attempt}, Input: in}}}); err != nil {
				require.ErrorIs(t, err, io.EOF)
			}
			_, err = s.Recv()
			requireGrantRefused(t, err)

			rl.g.mu.Lock()
			_, fenced := rl.g.highest[runID]
			rl.g.mu.Unlock()
			require.False(t, fenced, "no fence was recorded")
			require.Nil(t, rl.runner(sc), "no runner was registered")
			require.NoDirExists(t, filepath.Join(rl.cfg.StateRoot, sc), "nothing was prepared or launched")
			starts := countCalls(t, rl.callLog, "process-start")

			// The genuine run still attaches at attempt 1 and completes.
			opened, evs := rl.turn(ctx, runID, nil, in, nil)
			requireSucceeded(t, evs)
			require.False(t, opened.GetReused())
			require.Equal(t, starts+1, countCalls(t, rl.callLog, "process-start"), "one provider for the genuine run")
			require.Len(t, rl.g.Runners(), i+1, "one runner per genuine run, none for a forged one")
		})
	}
}

// TestS1_EveryGatewayCallNeedsAGrantForItself: SuspendRunner, CloseRunner,
// ListRunners and GetRunner refuse a missing grant, a grant of another
// call, run or gateway, and act on a grant for themselves.
func TestS1_EveryGatewayCallNeedsAGrantForItself(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fleetKey := testFleetKey
	now := time.Now()
	in := testInput("calls", "acme", "hello")
	_, evs := rl.turn(ctx, "run-calls", nil, in, nil)
	requireSucceeded(t, evs)
	sc := scope.OfRun("run-calls", in)
	with := func(c grant.Claims) context.Context {
		return metadata.AppendToOutgoingContext(ctx, grant.Header, sign(t, fleetKey, now, c))
	}
	own := grant.Claims{Method: grant.MethodCloseRunner, RunID: "run-calls", Scope: sc, Audience: testGatewayID}

	_, err := rl.raw.ListRunners(ctx, &gatewayv1.ListRunnersRequest{})
	requireGrantRefused(t, err)
	_, err = rl.raw.ListRunners(with(grant.Claims{Method: grant.MethodListRunners, Audience: "gw-elsewhere"}), &gatewayv1.ListRunnersRequest{})
	requireGrantRefused(t, err)
	_, err = rl.raw.ListRunners(with(own), &gatewayv1.ListRunnersRequest{})
	requireGrantRefused(t, err)
	list, err := rl.raw.ListRunners(with(grant.Claims{Method: grant.MethodListRunners, Audience: testGatewayID}), &gatewayv1.ListRunnersRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetRunners(), 1)
	inst := list.GetRunners()[0].GetRunnerInstanceId()
	_, err = rl.raw.GetRunner(ctx, &gatewayv1.GetRunnerRequest{RunnerInstanceId: inst})
	requireGrantRefused(t, err)
	got, err := rl.raw.GetRunner(with(grant.Claims{Method: grant.MethodGetRunner, Audience: testGatewayID}), &gatewayv1.GetRunnerRequest{RunnerInstanceId: inst})
	require.NoError(t, err)
	require.Equal(t, inst, got.GetRunner().GetRunnerInstanceId())

	_, err = rl.raw.SuspendRunner(ctx, &gatewayv1.SuspendRunnerRequest{Input: in, RunId: "run-calls"})
	requireGrantRefused(t, err)
	_, err = rl.raw.SuspendRunner(with(own), &gatewayv1.SuspendRunnerRequest{Input: in, RunId: "run-calls"})
	requireGrantRefused(t, err)

	close := &gatewayv1.CloseRunnerRequest{Input: in, RunId: "run-calls"}
	for _, c := range []grant.Claims{
		{Method: grant.MethodCloseRunner, RunID: "run-other", Scope: sc, Audience: testGatewayID},
		{Method: grant.MethodCloseRunner, RunID: "run-calls", Scope: scope.Of(testInput("x", "acme", "x")), Audience: testGatewayID},
		{Method: grant.MethodAttach, RunID: "run-calls", Scope: sc, Audience: testGatewayID},
	} {
		_, err = rl.raw.CloseRunner(with(c), close)
		requireGrantRefused(t, err)
	}
	require.True(t, rl.runner(sc).GetConnected(), "the refused calls left the runner alone")
	closed, err := rl.client.CloseRunner(ctx, close)
	require.NoError(t, err)
	require.True(t, closed.GetClosed())
}

// TestS1_AGatewayWithoutGrantKeysRefusesEveryCall: grants are on by
// default; a gateway configured without keys serves nobody.
func TestS1_AGatewayWithoutGrantKeysRefusesEveryCall(t *testing.T) {
	t.Parallel()
	g := New(Config{StateRoot: t.TempDir()})
	defer g.Close()
	_, err := g.ListRunners(context.Background())
	requireGrantRefused(t, err)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(grant.Header, "tg1.x.y.z"))
	_, err = g.CloseRunner(ctx, &gatewayv1.CloseRunnerRequest{Input: &prpv1.ExecutionInput{}})
	requireGrantRefused(t, err)
	entries, err := os.ReadDir(g.cfg.StateRoot)
	require.NoError(t, err)
	require.Empty(t, entries)
}

func TestS1_RevokedToolAuthorityEpochsAreDecidedAtTheGateway(t *testing.T) {
	t.Parallel()
	var epochs durable.Epochs
	first := epochs.Begin("scope-1", durable.ToolBinding{RunID: "run-1"})
	cmd := func(typ, epoch string) *prpv1.Command {
		return &prpv1.Command{CommandId: "c", Type: typ, RunId: "run-1", ControllerEpoch: epoch}
	}
	require.NoError(t, revokedToolAuthority(cmd("turn.start", ""), nil), "other commands pass")
	require.NoError(t, revokedToolAuthority(cmd(cmdToolResult, ""), first))
	require.NoError(t, revokedToolAuthority(cmd(cmdRequestResolve, "1"), first))
	for _, c := range []struct {
		name  string
		cmd   *prpv1.Command
		tools *durable.ToolAuthority
	}{
		{"another epoch", cmd(cmdToolResult, "2"), first},
		{"no authority", cmd(cmdToolResult, "1"), nil},
	} {
		err := revokedToolAuthority(c.cmd, c.tools)
		require.EqualValues(t, failure.NativeToolAuthorityEpochRevoked, failure.CodeOf(err), c.name)
	}
	epochs.Begin("scope-1", durable.ToolBinding{RunID: "run-2"}) // a continuation takes the scope
	for _, typ := range []string{cmdToolResult, cmdRequestResolve} {
		require.EqualValues(t, failure.NativeToolAuthorityEpochRevoked, failure.CodeOf(revokedToolAuthority(cmd(typ, "1"), first)), typ)
		require.EqualValues(t, failure.NativeToolAuthorityEpochRevoked, failure.CodeOf(revokedToolAuthority(cmd(typ, ""), first)), typ)
	}
}

// TestS1_AToolResultCarryingARevokedEpochIsRefusedAtTheGateway: over real
// gRPC, a tool result carrying another epoch than the attachment's is
// answered rejected by the gateway and never reaches the runner; one
// carrying the current epoch is the runner's to judge.
func TestS1_AToolResultCarryingARevokedEpochIsRefusedAtTheGateway(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := testInput("epochs", "acme", "hello")
	s, opened, err := rl.attach(ctx, "run-epochs", nil, in)
	require.NoError(t, err)
	epoch := opened.GetToolAuthorityEpoch()
	require.NotZero(t, epoch)
	result := func(id, epoch string) *prpv1.CommandResult {
		c := command(t, "run-epochs", 1, cmdToolResult, map[string]any{"callId": id, "text": "ok"})
		c.CommandId, c.ControllerEpoch = "run-epochs/tool/"+id, epoch
		require.NoError(t, s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Command{Command: c}}))
		for {
			m, err := s.Recv()
			require.NoError(t, err)
			if r := m.GetCommandResult(); r != nil && r.GetCommandId() == c.CommandId {
				return r
			}
		}
	}
	stale := result("call-stale", strconv.FormatUint(epoch+1, 10))
	require.Equal(t, "rejected", stale.GetStatus())
	require.Equal(t, failure.NativeToolAuthorityEpochRevoked, stale.GetCode(), stale.GetMessage())
	require.Zero(t, stale.GetControllerSeq(), "the runner never saw it")
	current := result("call-current", strconv.FormatUint(epoch, 10))
	require.NotEqual(t, failure.NativeToolAuthorityEpochRevoked, current.GetCode(), "the current epoch reaches the runner")
	require.NotZero(t, current.GetControllerSeq())
}
