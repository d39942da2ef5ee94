package gateway

import (
	"errors"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// metrics are the gateway's domain counters (served at the service's
// /metrics with the gRPC metrics).
type metrics struct {
	// launches counts runner launches for a run by how the scope's durable
	// root was authorised: fresh, exact_run, verified_prior_run.
	launches *prometheus.CounterVec
	// refusals counts launches refused by the durable authority, by code
	// and quarantine reason (none when nothing was moved).
	refusals *prometheus.CounterVec
	// rotations counts runs that took a live runner over from another run.
	rotations prometheus.Counter
	// migrations counts legacy roots renamed into their full scope.
	migrations prometheus.Counter
	// grantRefusals counts calls refused for their grant (SPEC S1), by
	// method.
	grantRefusals *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		launches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_runnergw_durable_launches_total",
			Help: "Runner launches for a run, by how the scope's durable root was authorised (fresh, exact_run, verified_prior_run).",
		}, []string{"source"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_runnergw_durable_refusals_total",
			Help: "Launches refused by the durable-state authority, by stable code and quarantine reason (none: the root was left untouched).",
		}, []string{"code", "quarantine"}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_runnergw_authority_rotations_total",
			Help: "Runs that took a live warm runner over from an earlier run (warm native session authority epoch rotated).",
		}),
		migrations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_runnergw_legacy_root_migrations_total",
			Help: "Legacy durable roots renamed atomically into their full session scope.",
		}),
		grantRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_runnergw_grant_refusals_total",
			Help: "RunnerGateway calls refused with " + failure.GatewayGrantInvalid + " (missing, forged, expired or mismatched grant), by method.",
		}, []string{"method"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.launches, m.refusals, m.rotations, m.migrations, m.grantRefusals} {
			_ = reg.Register(c)
		}
	}
	return m
}

// refused counts a launch the durable authority refused.
func (m *metrics) refused(err error) {
	q := "none"
	var f *failure.Error
	if errors.As(err, &f) {
		switch dest := f.Metadata[durable.MetaQuarantined]; {
		case strings.Contains(dest, "."+string(durable.IdentityMismatch)+"."):
			q = string(durable.IdentityMismatch)
		case dest != "":
			q = string(durable.IdentityIndeterminate)
		}
	}
	m.refusals.WithLabelValues(string(failure.CodeOf(err)), q).Inc()
}

// sessionGauges reads the gateway's session scopes at scrape time (SPEC
// D6): how many it holds a runner for, and of those how many have a live
// runner connection and an executor attached.
type sessionGauges struct{ g *Gateway }

var sessionScopesDesc = prometheus.NewDesc("tether_runnergw_session_scopes",
	"Session scopes this gateway holds a runner for, by state: known (every one), connected (its runnerd is connected), attached (an executor drives a run on it now).",
	[]string{"state"}, nil)

func (c sessionGauges) Describe(ch chan<- *prometheus.Desc) { ch <- sessionScopesDesc }

func (c sessionGauges) Collect(ch chan<- prometheus.Metric) {
	c.g.mu.Lock()
	runners := make([]*runner, 0, len(c.g.runners))
	for _, r := range c.g.runners {
		runners = append(runners, r)
	}
	c.g.mu.Unlock()
	var connected, attached int
	for _, r := range runners {
		r.mu.Lock()
		if r.conn != nil {
			connected++
		}
		if r.att != nil {
			attached++
		}
		r.mu.Unlock()
	}
	for state, n := range map[string]int{"known": len(runners), "connected": connected, "attached": attached} {
		ch <- prometheus.MustNewConstMetric(sessionScopesDesc, prometheus.GaugeValue, float64(n), state)
	}
}
