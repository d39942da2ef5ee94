package dispatch

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// metrics are the executor's domain metrics (SPEC D3). They exist whether
// or not Config.Metrics registers them, so the code counts unconditionally.
type metrics struct {
	claims    prometheus.Counter
	takeovers *prometheus.CounterVec
	handBacks prometheus.Counter
	// placementDeferrals: claims handed back because no gateway could
	// take the run's scope (SPEC F2).
	placementDeferrals prometheus.Counter
	renewals           *prometheus.CounterVec
	renewalSeconds     prometheus.Histogram
	active             prometheus.Gauge
	cancellations      *prometheus.CounterVec
	retries            *prometheus.CounterVec
	failures           *prometheus.CounterVec
	// runtimeQuestions counts runtime input request lifecycle steps (SPEC
	// E5) by outcome and adapter; no request content.
	runtimeQuestions *prometheus.CounterVec
	// outcomes counts the runs this replica ended, by state and failure
	// code; submitToTurn and turnSeconds are the latencies a caller sees
	// (SPEC D6).
	outcomes     *prometheus.CounterVec
	submitToTurn prometheus.Histogram
	turnSeconds  *prometheus.HistogramVec
}

// latencyBuckets span a warm turn's start (milliseconds) to a long agent
// turn (an hour).
var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// outcomeCode is the code label of a run outcome: a registered failure
// reason (its base), "none" for a run without one, "other" for a code the
// registry does not know (a provider's own), so the label's values stay a
// fixed set.
func outcomeCode(code string) string {
	if code == "" {
		return "none"
	}
	r := failure.Reason(code).Base()
	if _, ok := failure.Lookup(r); ok {
		return string(r)
	}
	return "other"
}

// Label values of the domain metrics.
const (
	takeoverLeaseExpired   = "lease_expired"
	takeoverControllerDead = "controller_dead"
	renewalRenewed         = "renewed"
	renewalLost            = "lost"
	renewalFailed          = "failed"
	cancelDispatched       = "dispatched"
	cancelAcknowledged     = "acknowledged"
	cancelRefused          = "refused"
)

func newMetrics(reg prometheus.Registerer, st *store.Store) *metrics {
	m := &metrics{
		claims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_executor_claims_total",
			Help: "Runs this replica claimed (a lease taken: queued runs, due retries and takeovers).",
		}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_executor_takeovers_total",
			Help: "Claims that took a run over from another controller, by reason (lease_expired, controller_dead: proven dead on this host before expiry).",
		}, []string{"reason"}),
		placementDeferrals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_executor_placement_deferrals_total",
			Help: "Claimed runs handed back to the queue because no active gateway satisfying their placement labels had room (gateway_capacity_exhausted).",
		}),
		handBacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_executor_lease_hand_backs_total",
			Help: "Leases this replica released under their fence when it stopped (SIGTERM), for another replica to claim at once.",
		}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_executor_lease_renewals_total",
			Help: "Lease renewals by outcome per lease (renewed; lost: the lease was no longer this replica's; failed: the statement failed and the self-fence bound decides).",
		}, []string{"outcome"}),
		renewalSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tether_executor_lease_renewal_seconds",
			Help:    "Latency of one renewal statement (all held leases of this replica at once).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_executor_active_runs",
			Help: "Runs this replica drives now (holding their lease).",
		}),
		cancellations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_executor_cancellations_total",
			Help: "Durable cancellations by step (dispatched to the runner, acknowledged by it, refused by it).",
		}, []string{"outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_executor_retries_total",
			Help: "Failed attempts scheduled for a retry, by the stable code of what failed (e.g. runner_attach_failed).",
		}, []string{"code"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_executor_terminal_failures_total",
			Help: "Failed attempts that failed their run for good, by failure code.",
		}, []string{"code"}),
		runtimeQuestions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_executor_runtime_questions_total",
			Help: "Runtime input requests by lifecycle outcome (normalized, rejected, resolved, durable_handoff, provider_loss_handoff, expired, cancelled) and adapter; no request content.",
		}, []string{"outcome", "adapter"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_executor_run_outcomes_total",
			Help: "Runs this replica ended, by outcome (succeeded, failed, cancelled) and code (a registered failure reason, none, or other).",
		}, []string{"outcome", "code"}),
		submitToTurn: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tether_executor_submit_to_turn_started_seconds",
			Help:    "From a run's submission (its row's creation, the database's clock) to its first attempt's turn.started being persisted by this replica.",
			Buckets: latencyBuckets,
		}),
		turnSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_executor_turn_seconds",
			Help:    "From a run's turn.started to its run.terminal, both persisted by this replica's driver, by outcome.",
			Buckets: latencyBuckets,
		}, []string{"outcome"}),
	}
	for _, r := range []string{takeoverLeaseExpired, takeoverControllerDead} {
		m.takeovers.WithLabelValues(r)
	}
	for _, o := range []string{renewalRenewed, renewalLost, renewalFailed} {
		m.renewals.WithLabelValues(o)
	}
	for _, o := range []string{cancelDispatched, cancelAcknowledged, cancelRefused} {
		m.cancellations.WithLabelValues(o)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.claims, m.takeovers, m.handBacks, m.placementDeferrals, m.renewals, m.renewalSeconds, m.active,
			m.cancellations, m.retries, m.failures, m.runtimeQuestions, m.outcomes, m.submitToTurn, m.turnSeconds, &queueDepth{store: st}} {
			_ = reg.Register(c)
		}
	}
	return m
}

// queueDepth reads the runs waiting to be claimed from the database when
// scraped (the same figure on every replica: the queue is shared).
type queueDepth struct{ store *store.Store }

const queueDepthHelp = "Runs waiting to be claimed, by phase (queued; retryable_failure: waiting for their next attempt), read from the database at scrape time; the same on every replica."

var queueDepthDesc = prometheus.NewDesc("tether_executor_queue_depth", queueDepthHelp, []string{"phase"}, nil)

// queueDepthTimeout bounds the scrape's query.
const queueDepthTimeout = 2 * time.Second

func (q *queueDepth) Describe(ch chan<- *prometheus.Desc) { ch <- queueDepthDesc }

func (q *queueDepth) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), queueDepthTimeout)
	defer cancel()
	depth, err := q.store.QueueDepth(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(queueDepthDesc, err)
		return
	}
	for phase, n := range depth {
		ch <- prometheus.MustNewConstMetric(queueDepthDesc, prometheus.GaugeValue, float64(n), phase)
	}
}
