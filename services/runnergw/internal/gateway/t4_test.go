package gateway

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grant"
)

// rawAttach opens an Attach with grant tok and the Open of runID (attempt 1,
// owner test), and returns the gateway's first answer.
func (rl *relay) rawAttach(ctx context.Context, tok, runID string, open *gatewayv1.Open) (gatewayv1.RunnerGateway_AttachClient, *gatewayv1.AttachResponse, error) {
	s, err := rl.raw.Attach(metadata.AppendToOutgoingContext(ctx, grant.Header, tok))
	if err != nil {
		return nil, nil, err
	}
	if err := s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Open{Open: open}}); err != nil && err != io.EOF {
		return nil, nil, err
	}
	m, err := s.Recv()
	return s, m, err
}

func openGrant(t *testing.T, open *gatewayv1.Open) string {
	c := grant.ClaimsForOpen(open)
	c.Audience = testGatewayID
	return sign(t, testFleetKey, time.Now(), c)
}

// A grant is usable once (SPEC T4): the same grant presented again — a
// copy replayed within its TTL — is refused gateway_grant_invalid, for a
// unary call and for an Attach; the genuine run still completes its one
// turn on one provider.
func TestT4_AGrantIsUsableOnce(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	tok := sign(t, testFleetKey, time.Now(), grant.Claims{Method: grant.MethodListRunners, Audience: testGatewayID})
	_, err := rl.raw.ListRunners(metadata.AppendToOutgoingContext(ctx, grant.Header, tok), &gatewayv1.ListRunnersRequest{})
	require.NoError(t, err)
	_, err = rl.raw.ListRunners(metadata.AppendToOutgoingContext(ctx, grant.Header, tok), &gatewayv1.ListRunnersRequest{})
	requireGrantRefused(t, err)
	require.Contains(t, err.Error(), "already used")

	in := testInput("t4-once", "acme", "the genuine prompt")
	open := &gatewayv1.Open{RunId: "t4-once", Fence: &gatewayv1.FencingToken{Owner: "test", Attempt: 1}, Input: in}
	atok := openGrant(t, open)
	s, m, err := rl.rawAttach(ctx, atok, "t4-once", open)
	require.NoError(t, err)
	require.NotNil(t, m.GetOpened())
	require.NoError(t, s.CloseSend())
	_, _, err = rl.rawAttach(ctx, atok, "t4-once", open)
	requireGrantRefused(t, err)
	require.Contains(t, err.Error(), "already used")

	_, evs := rl.turn(ctx, "t4-once", nil, in, nil)
	requireSucceeded(t, evs)
	require.Equal(t, 1, countCalls(t, rl.callLog, "turn/start"), "one provider turn")
}

// A grant for a run an executor attested ended (a later run's Open names
// it a terminal prior run) is refused, even never used: an attach is
// authorized only while its run is live (SPEC T4). Nothing is started; the
// next run of the scope still completes.
func TestT4_AGrantForAnEndedRunIsRefused(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in := testInput("t4-ended", "acme", "first")
	_, evs := rl.turn(ctx, "t4-a", nil, in, nil)
	requireSucceeded(t, evs)
	// A grant for t4-a minted while it ran, kept by an attacker.
	open := &gatewayv1.Open{RunId: "t4-a", Fence: &gatewayv1.FencingToken{Owner: "test", Attempt: 1}, Input: in}
	kept := openGrant(t, open)

	rl.prior = []*gatewayv1.PriorRun{{RunId: "t4-a", Status: "succeeded", Terminal: true, Input: in}}
	_, evs = rl.turn(ctx, "t4-b", nil, testInput("t4-ended", "acme", "second"), nil)
	requireEndedSucceeded(t, evs)
	turns := countCalls(t, rl.callLog, "turn/start")

	_, _, err := rl.rawAttach(ctx, kept, "t4-a", open)
	requireGrantRefused(t, err)
	require.Contains(t, err.Error(), "ended")
	// Fresh grants for it are refused alike.
	_, _, err = rl.rawAttach(ctx, openGrant(t, open), "t4-a", open)
	requireGrantRefused(t, err)
	require.Equal(t, turns, countCalls(t, rl.callLog, "turn/start"), "no turn started")

	rl.prior = append(rl.prior, &gatewayv1.PriorRun{RunId: "t4-b", Status: "succeeded", Terminal: true})
	_, evs = rl.turn(ctx, "t4-c", nil, testInput("t4-ended", "acme", "third"), nil)
	requireEndedSucceeded(t, evs)
	require.Equal(t, turns+1, countCalls(t, rl.callLog, "turn/start"))
}

// requireEndedSucceeded checks that a later turn of a warm runner (its
// source seqs continue the earlier turns') ended succeeded.
func requireEndedSucceeded(t *testing.T, evs []*prpv1.Event) {
	t.Helper()
	require.NotEmpty(t, evs)
	term := evs[len(evs)-1]
	require.Equal(t, "run.terminal", term.GetEventType())
	require.Equal(t, "succeeded", term.GetPayload().AsMap()["runTerminalState"], "%v", term.GetPayload().AsMap())
}

// A grant that reached other hands unused can start no turn of its own
// (SPEC T4): the attach relays only the turn.start its Open and grant name
// (command id and text); another is rejected gateway_grant_invalid and
// never reaches the runner, and the genuine turn still runs once.
func TestT4_AnAttachStartsOnlyTheTurnItsGrantNames(t *testing.T) {
	t.Parallel()
	rl := newRelay(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in := testInput("t4-turn", "acme", "the genuine prompt")
	open := &gatewayv1.Open{RunId: "t4-turn", Fence: &gatewayv1.FencingToken{Owner: "test", Attempt: 1}, Input: in,
		Turn: grant.TurnDigest("t4-turn/turn.start", in.GetTask().GetPrompt())}
	s, m, err := rl.rawAttach(ctx, openGrant(t, open), "t4-turn", open)
	require.NoError(t, err)
	require.NotNil(t, m.GetOpened())
	injected := command(t, "t4-turn", 1, "turn.start", map[string]any{"text": "attacker text"})
	injected.CommandId = "t4-turn/g9/turn.start"
	for _, c := range []*prpv1.Command{injected} {
		require.NoError(t, s.Send(&gatewayv1.AttachRequest{Kind: &gatewayv1.AttachRequest_Command{Command: c}}))
	}
	for {
		m, err := s.Recv()
		require.NoError(t, err)
		if r := m.GetCommandResult(); r != nil {
			require.Equal(t, "rejected", r.GetStatus())
			require.Equal(t, "gateway_grant_invalid", r.GetCode(), r.GetMessage())
			break
		}
	}
	require.NoError(t, s.CloseSend())
	require.Zero(t, countCalls(t, rl.callLog, "turn/start"), "no provider turn")

	_, evs := rl.turn(ctx, "t4-turn", nil, in, nil)
	requireSucceeded(t, evs)
	require.Equal(t, 1, countCalls(t, rl.callLog, "turn/start"), "the genuine turn, once")
}
