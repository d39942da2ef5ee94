// Package announce registers a runner gateway with the executor fleet's
// gateway registry and keeps it there with heartbeats (SPEC F1): its id,
// advertised address, labels, capacity and current sessions. The gateway
// never touches the database; any executor replica records it.
package announce

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/identity"
)

// Config is what a gateway announces and to whom.
type Config struct {
	// Registries are the executor replicas' registry clients, tried in
	// turn until one answers.
	Registries []executorv1.GatewayRegistryClient
	ID         string
	Address    string
	Labels     map[string]string
	Capacity   int
	// Sessions counts the session scopes the gateway holds now.
	Sessions func() int
	// Interval between heartbeats until a registry names one.
	Interval time.Duration
	Logger   *slog.Logger
	// Secret is the registration secret whose proof every announcement
	// carries (SPEC T5; identity.WithRegistrationProof), for registries
	// that cannot see a runnergw certificate. Empty: none is sent.
	Secret []byte
	// Draining, once closed, makes every later heartbeat announce the
	// gateway draining (it is stopping and waits for its scopes to be
	// moved); nil: only the last announcement does.
	Draining <-chan struct{}
}

// callTimeout bounds one announcement.
const callTimeout = 5 * time.Second

// Announcer heartbeats a gateway.
type Announcer struct {
	cfg  Config
	next int // the registry tried first
}

// New returns an Announcer.
func New(cfg Config) *Announcer {
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Sessions == nil {
		cfg.Sessions = func() int { return 0 }
	}
	return &Announcer{cfg: cfg}
}

// Refused reports an announcement no retry can change (a capacity of 0 or
// less, an id held by a live gateway elsewhere, bad input).
func Refused(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.AlreadyExists, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}

// Announce sends one announcement (draining says the gateway takes no new
// placements), trying each registry in turn, and returns the registry's
// answer.
func (a *Announcer) Announce(ctx context.Context, draining bool) (*executorv1.RegisterGatewayResponse, error) {
	req := &executorv1.RegisterGatewayRequest{GatewayId: a.cfg.ID, Address: a.cfg.Address, Labels: a.cfg.Labels,
		Capacity: int32(a.cfg.Capacity), Sessions: int32(a.cfg.Sessions()), Draining: draining}
	var err error
	for range a.cfg.Registries {
		r := a.cfg.Registries[a.next%len(a.cfg.Registries)]
		cctx, cancel := context.WithTimeout(identity.WithRegistrationProof(ctx, a.cfg.Secret), callTimeout)
		var resp *executorv1.RegisterGatewayResponse
		resp, err = r.RegisterGateway(cctx, req)
		cancel()
		if err == nil || Refused(err) {
			return resp, err
		}
		a.next++ // this replica is away: the next one
	}
	return nil, err
}

// Run heartbeats until ctx ends, then announces the gateway draining once
// (a stopping gateway takes no new placements).
func (a *Announcer) Run(ctx context.Context) {
	interval := a.cfg.Interval
	drainingSent := 0
	for {
		draining := closed(a.cfg.Draining)
		resp, err := a.Announce(ctx, draining)
		switch {
		case err == nil:
			if d := resp.GetHeartbeatInterval().AsDuration(); d > 0 {
				interval = d
			}
			if draining {
				drainingSent++
			}
		case ctx.Err() == nil:
			a.cfg.Logger.Warn("announcing the gateway to the registry failed", "gateway_id", a.cfg.ID, "err", err)
		}
		if drainingSent == 1 {
			// A gateway that heartbeats on after announcing its
			// shutdown asks for its scopes to be moved: say so at once.
			continue
		}
		t := time.NewTimer(interval)
		drainCh := a.cfg.Draining
		if draining {
			drainCh = nil // announced already: wait for the next beat
		}
		select {
		case <-drainCh:
			// Tell the registry at once, not at the next beat.
			t.Stop()
			continue
		case <-ctx.Done():
			t.Stop()
			fctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			if _, err := a.Announce(fctx, true); err != nil {
				a.cfg.Logger.Warn("announcing the gateway draining failed", "gateway_id", a.cfg.ID, "err", err)
			}
			cancel()
			return
		case <-t.C:
		}
	}
}

// closed reports whether ch is closed (a nil channel never is).
func closed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
