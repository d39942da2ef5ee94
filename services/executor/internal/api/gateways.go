package api

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/services/executor/internal/authz"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// DefaultGatewayTTL is how long a gateway stays active without a heartbeat
// before it is lost (SPEC F1); gateways heartbeat every third of it.
const DefaultGatewayTTL = 15 * time.Second

// Registry implements tether.executor.v1.GatewayRegistry.
type Registry struct {
	executorv1.UnsafeGatewayRegistryServer
	Store *store.Store
	// TTL after which a silent gateway is lost (DefaultGatewayTTL when 0).
	TTL time.Duration
	// Secret is the registration secret (SPEC T5): a caller without a
	// certificate identity or an authenticated principal must prove it
	// (identity.RegistrationHeader). Empty: such a caller is refused.
	Secret []byte
}

func (r *Registry) ttl() time.Duration {
	if r.TTL <= 0 {
		return DefaultGatewayTTL
	}
	return r.TTL
}

// RegisterGateway records a gateway's announcement or heartbeat, once its
// caller is authenticated as a gateway (authenticateRegistration).
func (r *Registry) RegisterGateway(ctx context.Context, req *executorv1.RegisterGatewayRequest) (*executorv1.RegisterGatewayResponse, error) {
	if err := authenticateRegistration(ctx, r.Secret); err != nil {
		return nil, err
	}
	g, err := r.Store.RegisterGateway(ctx, store.GatewayAnnouncement{
		ID: req.GetGatewayId(), Address: req.GetAddress(), Labels: req.GetLabels(),
		Capacity: int(req.GetCapacity()), Sessions: int(req.GetSessions()), Draining: req.GetDraining(),
	}, r.ttl())
	if err != nil {
		return nil, err
	}
	return &executorv1.RegisterGatewayResponse{Gateway: g, HeartbeatInterval: durationpb.New(r.ttl() / 3), Ttl: durationpb.New(r.ttl())}, nil
}

// authenticateRegistration admits a gateway's announcement (SPEC T5): over
// mTLS only the runnergw certificate; a principal the authorization layer
// admitted (tokens or certificates required: an operator or the runnergw
// service); otherwise — loopback development, plaintext — only a call
// carrying the registration secret's proof.
func authenticateRegistration(ctx context.Context, secret []byte) error {
	if roles := grpcx.PeerRoles(ctx); roles != nil {
		if !slices.Contains(roles, identity.Gateway) {
			return failure.New(codes.PermissionDenied, failure.PeerNotAuthorized,
				"only a runner gateway's certificate may register a gateway (peer roles: %v)", roles)
		}
		return nil
	}
	if authz.FromContext(ctx) != nil || identity.HasRegistrationProof(ctx, secret) {
		return nil
	}
	return failure.New(codes.Unauthenticated, failure.GatewayRegistrationUnauthenticated,
		"a gateway registers with its runnergw certificate or, without one, with the proof of the registration secret (-registration-secret-file, metadata %q)", identity.RegistrationHeader)
}

// ListGateways lists the registry.
func (r *Registry) ListGateways(ctx context.Context, req *executorv1.ListGatewaysRequest) (*executorv1.ListGatewaysResponse, error) {
	gs, next, err := r.Store.ListGatewaysPage(ctx, r.ttl(), int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	return &executorv1.ListGatewaysResponse{Gateways: gs, NextPageToken: next}, nil
}

// DrainGateway starts (or repeats) an operator's drain of a gateway (SPEC
// F4); the replicas' drainers move its scopes.
func (r *Registry) DrainGateway(ctx context.Context, req *executorv1.DrainGatewayRequest) (*executorv1.DrainGatewayResponse, error) {
	// The drain records the operator that asked (SPEC T2).
	ctx = store.WithActor(ctx, authz.Actor(ctx, "dev:"+grpcx.PeerIdentity(ctx)))
	g, err := r.Store.DrainGateway(ctx, req.GetGatewayId(), req.GetReason(), r.ttl())
	if err != nil {
		return nil, err
	}
	return &executorv1.DrainGatewayResponse{Gateway: g}, nil
}

// gatewaySessionsDesc and gatewayCapacityDesc are the registry's load per
// gateway (SPEC D3), read at scrape time: the same on every replica.
var (
	gatewaySessionsDesc = prometheus.NewDesc("tether_executor_gateway_sessions",
		"Session scopes each registered gateway holds, as it last announced, by gateway and state (active, draining, lost); read from the database at scrape time.",
		[]string{"gateway", "state"}, nil)
	gatewayCapacityDesc = prometheus.NewDesc("tether_executor_gateway_capacity",
		"Session scopes each registered gateway holds at most, as it announced.", []string{"gateway"}, nil)
)

// Describe implements prometheus.Collector.
func (r *Registry) Describe(ch chan<- *prometheus.Desc) {
	ch <- gatewaySessionsDesc
	ch <- gatewayCapacityDesc
}

// Collect implements prometheus.Collector: the registry's load per gateway.
func (r *Registry) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	gs, err := r.Store.ListGateways(ctx, r.ttl())
	if err != nil {
		ch <- prometheus.NewInvalidMetric(gatewaySessionsDesc, err)
		return
	}
	for _, g := range gs {
		state := strings.ToLower(strings.TrimPrefix(g.GetState().String(), "GATEWAY_STATE_"))
		ch <- prometheus.MustNewConstMetric(gatewaySessionsDesc, prometheus.GaugeValue, float64(g.GetSessions()), g.GetGatewayId(), state)
		ch <- prometheus.MustNewConstMetric(gatewayCapacityDesc, prometheus.GaugeValue, float64(g.GetCapacity()), g.GetGatewayId())
	}
}
