package gateway

import (
	"slices"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/prp"
)

// ModeName is the wire name of a transport mode ("" for unknown values).
func ModeName(m gatewayv1.TransportMode) string {
	switch m {
	case gatewayv1.TransportMode_TRANSPORT_MODE_UNSPECIFIED, gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WS_LOOPBACK:
		return prp.ModeDialWSLoopback
	case gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WSS:
		return prp.ModeDialWSS
	case gatewayv1.TransportMode_TRANSPORT_MODE_LISTEN_WS:
		return prp.ModeListenWS
	}
	return ""
}

// ModeEnum is the inverse of ModeName.
func ModeEnum(name string) gatewayv1.TransportMode {
	switch name {
	case prp.ModeDialWSS:
		return gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WSS
	case prp.ModeListenWS:
		return gatewayv1.TransportMode_TRANSPORT_MODE_LISTEN_WS
	}
	return gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WS_LOOPBACK
}

// ResolveTransportMode selects the transport for a run (G3). Sandbox
// ingress (listen_ws: the gateway dials a runner listening inside the
// sandbox) is selected only for a run authorised for it; otherwise the
// answer is runner_ingress_unavailable, before anything is launched or
// opened, and there is no fall-through to another mode. Unspecified means
// the local dial_ws_loopback.
func ResolveTransportMode(requested gatewayv1.TransportMode, runnerIngressAuthorized bool) (string, error) {
	name := ModeName(requested)
	switch name {
	case "":
		return "", failure.New(codes.InvalidArgument, failure.RunnerTransportIneligible, "unknown runner transport mode %d", int32(requested))
	case prp.ModeListenWS:
		if !runnerIngressAuthorized {
			return "", failure.New(codes.FailedPrecondition, failure.RunnerIngressUnavailable,
				"sandbox ingress (listen_ws) is not authorised for this run")
		}
	}
	return name, nil
}

// IngressPolicy is the gateway operator's side of ingress authorisation:
// which companies' runs may use sandbox ingress at all. A run is authorised
// when the executor marks its target as authorised for ingress
// (RunnerTarget.runner_ingress_authorized) AND this policy admits the run's
// company.
type IngressPolicy struct {
	// Companies admitted; "*" admits every company; empty disables ingress.
	Companies []string
}

// ParseIngressPolicy parses a comma-separated company list.
func ParseIngressPolicy(s string) IngressPolicy {
	var p IngressPolicy
	for _, c := range strings.Split(s, ",") {
		if c = strings.TrimSpace(c); c != "" {
			p.Companies = append(p.Companies, c)
		}
	}
	return p
}

// Admits reports whether runs of company may use sandbox ingress.
func (p IngressPolicy) Admits(company string) bool {
	if slices.Contains(p.Companies, "*") {
		return true
	}
	return company != "" && slices.Contains(p.Companies, company)
}

// Enabled reports whether any run may use sandbox ingress.
func (p IngressPolicy) Enabled() bool { return len(p.Companies) > 0 }
