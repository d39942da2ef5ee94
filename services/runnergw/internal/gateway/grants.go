package gateway

import (
	"context"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// authorize checks the call's grant (SPEC S1) before anything else happens:
// a refused call records no fence, touches no runner and launches nothing.
// A gateway without grant keys refuses every call.
func (g *Gateway) authorize(ctx context.Context, want grant.Want) error {
	c, err := g.authenticate(ctx, want.Method)
	if err != nil {
		return err
	}
	return g.match(c, want)
}

// authenticate checks the signature, expiry, audience and method of the
// call's grant, before its request is read.
func (g *Gateway) authenticate(ctx context.Context, method string) (*grant.Claims, error) {
	c, err := g.grantOf(ctx, method)
	if err == nil {
		// A grant authorizes one call (SPEC T4): a copy is refused.
		err = g.spent.Spend(c)
	}
	if err != nil {
		g.metrics.grantRefusals.WithLabelValues(method).Inc()
		g.log.Warn("gateway call refused", "method", method, "err", err)
		return nil, err
	}
	return c, nil
}

func (g *Gateway) grantOf(ctx context.Context, method string) (*grant.Claims, error) {
	if g.cfg.Grants == nil {
		return nil, failure.New(codes.Unauthenticated, failure.GatewayGrantInvalid, "this gateway has no grant public keys configured (-grant-public-keys); it refuses every call")
	}
	var tok string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		v := md.Get(grant.Header)
		if len(v) > 1 {
			return nil, failure.New(codes.Unauthenticated, failure.GatewayGrantInvalid, "more than one grant")
		}
		if len(v) == 1 {
			tok = v[0]
		}
	}
	return g.cfg.Grants.Authenticate(tok, method)
}

// match checks authenticated claims against the call's request.
func (g *Gateway) match(c *grant.Claims, want grant.Want) error {
	if err := c.Match(want); err != nil {
		g.metrics.grantRefusals.WithLabelValues(want.Method).Inc()
		g.log.Warn("gateway call refused", "method", want.Method, "run_id", want.RunID, "err", err)
		return err
	}
	return nil
}

// refuseEnded refuses an Attach for a run an executor attested ended (SPEC
// T4): a grant authorizes an attach only while its run is live, so a grant
// minted before the run ended starts nothing after.
func (g *Gateway) refuseEnded(runID string) error {
	g.mu.Lock()
	ended := g.ended[runID]
	g.mu.Unlock()
	if !ended {
		return nil
	}
	g.metrics.grantRefusals.WithLabelValues(grant.MethodAttach).Inc()
	err := failure.New(codes.Unauthenticated, failure.GatewayGrantInvalid,
		"run %s ended (its executor recorded its outcome): no grant authorizes an attach for it", runID)
	g.log.Warn("gateway call refused", "method", grant.MethodAttach, "run_id", runID, "err", err)
	return err
}

// endRuns records the runs a granted Open names as ended (its prior runs
// the executor marks terminal; never the run it opens), the most recent
// maxFencedRuns of them.
func (g *Gateway) endRuns(prior []*gatewayv1.PriorRun, opening string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range prior {
		id := p.GetRunId()
		if !p.GetTerminal() || id == opening || g.ended[id] {
			continue
		}
		g.ended[id] = true
		g.endedOrder = append(g.endedOrder, id)
		for len(g.endedOrder) > maxFencedRuns {
			delete(g.ended, g.endedOrder[0])
			g.endedOrder = g.endedOrder[1:]
		}
	}
}

// wantOpen is what an Attach with this Open needs its grant to say.
func wantOpen(o *gatewayv1.Open) grant.Want {
	c := grant.ClaimsForOpen(o)
	return grant.Want{Method: c.Method, RunID: c.RunID, Scope: c.Scope, Fenced: true, Owner: c.Owner, Attempt: c.Attempt, Turn: c.Turn}
}

// ListRunners lists the known runners for a granted caller.
func (g *Gateway) ListRunners(ctx context.Context) ([]*gatewayv1.Runner, error) {
	if err := g.authorize(ctx, grant.Want{Method: grant.MethodListRunners}); err != nil {
		return nil, err
	}
	return g.Runners(), nil
}

// GetRunner returns one runner for a granted caller.
func (g *Gateway) GetRunner(ctx context.Context, id string) (*gatewayv1.Runner, error) {
	if err := g.authorize(ctx, grant.Want{Method: grant.MethodGetRunner}); err != nil {
		return nil, err
	}
	return g.Runner(id)
}

// Commands that act under the scope's tool authority.
const (
	cmdToolResult     = prp.CommandToolResult
	cmdRequestResolve = prp.CommandRequestResolve
)

// unauthorizedTurn refuses a turn.start other than the one the attach's
// Open (and so its grant) names (SPEC T4): a grant that reached the wrong
// hands can start no turn of its own. Other commands pass.
func unauthorizedTurn(cmd *prpv1.Command, turn string) error {
	if cmd.GetType() != prp.CommandTurnStart {
		return nil
	}
	body, err := prp.TurnStartOf(cmd)
	if err != nil || turn == "" || grant.TurnDigest(cmd.GetCommandId(), body.GetText()) != turn {
		return failure.New(codes.PermissionDenied, failure.GatewayGrantInvalid,
			"turn.start %s is not the turn this attach's grant authorizes", cmd.GetCommandId())
	}
	return nil
}

// revokedToolAuthority refuses a tool result or runtime-request answer whose
// tool authority epoch is no longer the scope's current one: the
// attachment's epoch was revoked (a later run took the scope), or the
// command carries another epoch (controller_epoch) than the attachment's.
// Other commands pass.
func revokedToolAuthority(cmd *prpv1.Command, tools *durable.ToolAuthority) error {
	if t := cmd.GetType(); t != cmdToolResult && t != cmdRequestResolve {
		return nil
	}
	if tools == nil {
		return failure.New(codes.FailedPrecondition, failure.NativeToolAuthorityEpochRevoked, "run %s holds no tool authority", cmd.GetRunId())
	}
	if _, err := tools.Binding(); err != nil {
		return err
	}
	if e := cmd.GetControllerEpoch(); e != "" && e != strconv.FormatUint(tools.Epoch(), 10) {
		return failure.New(codes.FailedPrecondition, failure.NativeToolAuthorityEpochRevoked,
			"tool authority epoch %s of run %s was revoked (the scope's current epoch is %d)", e, cmd.GetRunId(), tools.Epoch())
	}
	return nil
}
