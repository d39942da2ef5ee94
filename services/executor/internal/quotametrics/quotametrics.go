// Package quotametrics exports the per-company figures of SPEC Q4 as
// Prometheus metrics, read from PostgreSQL at each scrape (so every replica
// reports the fleet's figures, the same on each: aggregate them with max,
// not sum).
//
// Label cardinality is bounded: a company with its own row in
// executor.company_limits (an operator set its limits) is labelled with its
// id; every other company is summed under company="_other". The number of
// series is so at most (operators' rows + 1) × the reasons, whatever the
// number of companies.
package quotametrics

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-run/tether/services/executor/internal/store"
)

// scrapeTimeout bounds a scrape's query.
const scrapeTimeout = 2 * time.Second

var (
	runsDesc = prometheus.NewDesc("tether_company_runs", "Runs of the company now, by state (running: holding a lease; queued: waiting to start or for a retry). Fleet-wide, from PostgreSQL.",
		[]string{"company", "state"}, nil)
	spendDesc = prometheus.NewDesc("tether_company_spend_usd", "Settled USD cost of the company's runs in the current calendar month (UTC). Fleet-wide.",
		[]string{"company"}, nil)
	refusedDesc = prometheus.NewDesc("tether_company_refused_total", "Submissions refused by a limit or the budget, by reason (quota_queued_runs, quota_warm_sessions, budget_exhausted). Fleet-wide.",
		[]string{"company", "reason"}, nil)
	warningsDesc = prometheus.NewDesc("tether_company_budget_warnings_total", "budget.warning records (one per company and month at most). Fleet-wide.",
		[]string{"company"}, nil)
)

// Collector is the per-company metrics collector.
type Collector struct {
	Store  *store.Store
	Logger *slog.Logger
}

var _ prometheus.Collector = (*Collector)(nil)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{runsDesc, spendDesc, refusedDesc, warningsDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: one query per scrape; on error
// nothing is reported (and the error logged).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	figs, err := c.Store.CompanyFiguresOf(ctx, c.Store.Month())
	if err != nil {
		if c.Logger != nil {
			c.Logger.Warn("reading the per-company metrics", "err", err)
		}
		return
	}
	for _, f := range figs {
		ch <- prometheus.MustNewConstMetric(runsDesc, prometheus.GaugeValue, float64(f.Running), f.Label, "running")
		ch <- prometheus.MustNewConstMetric(runsDesc, prometheus.GaugeValue, float64(f.Queued), f.Label, "queued")
		ch <- prometheus.MustNewConstMetric(spendDesc, prometheus.GaugeValue, f.SpendUSD, f.Label)
		ch <- prometheus.MustNewConstMetric(warningsDesc, prometheus.CounterValue, float64(f.BudgetWarnings), f.Label)
		for reason, n := range f.Refused {
			ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(n), f.Label, reason)
		}
	}
}
