package pgstore

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// PoolCollector exports the statistics of a process's pools (by name),
// read at scrape time, as tether_db_pool_* metrics labelled with the
// pool's name (SPEC D6): the
// connections by state against the maximum, and how often and how long
// callers waited for one — the first figures to read when database calls
// slow down. One label value per pool a process opens (the executor has
// "main" and "watch"), so the cardinality is fixed.
func PoolCollector(pools map[string]*pgxpool.Pool) prometheus.Collector {
	return &poolCollector{pools: pools}
}

type poolCollector struct{ pools map[string]*pgxpool.Pool }

var (
	poolConnsDesc = prometheus.NewDesc("tether_db_pool_connections",
		"Connections of a database pool by state (acquired: in use; idle; constructing), read at scrape time.", []string{"pool", "state"}, nil)
	poolMaxDesc = prometheus.NewDesc("tether_db_pool_max_connections",
		"The most connections a database pool opens.", []string{"pool"}, nil)
	poolAcquiresDesc = prometheus.NewDesc("tether_db_pool_acquires_total",
		"Connections taken from a database pool.", []string{"pool"}, nil)
	poolEmptyAcquiresDesc = prometheus.NewDesc("tether_db_pool_empty_acquires_total",
		"Acquisitions that found no idle connection and waited for one to be opened or released.", []string{"pool"}, nil)
	poolWaitDesc = prometheus.NewDesc("tether_db_pool_empty_acquire_wait_seconds_total",
		"Time callers spent waiting in acquisitions that found no idle connection.", []string{"pool"}, nil)
	poolCanceledDesc = prometheus.NewDesc("tether_db_pool_canceled_acquires_total",
		"Acquisitions given up because their context ended first.", []string{"pool"}, nil)
)

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolConnsDesc, poolMaxDesc, poolAcquiresDesc, poolEmptyAcquiresDesc, poolWaitDesc, poolCanceledDesc} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for name, pool := range c.pools {
		collectPool(ch, name, pool.Stat())
	}
}

func collectPool(ch chan<- prometheus.Metric, name string, s *pgxpool.Stat) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{name}, labels...)...)
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, name)
	}
	gauge(poolConnsDesc, float64(s.AcquiredConns()), "acquired")
	gauge(poolConnsDesc, float64(s.IdleConns()), "idle")
	gauge(poolConnsDesc, float64(s.ConstructingConns()), "constructing")
	gauge(poolMaxDesc, float64(s.MaxConns()))
	counter(poolAcquiresDesc, float64(s.AcquireCount()))
	counter(poolEmptyAcquiresDesc, float64(s.EmptyAcquireCount()))
	counter(poolWaitDesc, s.EmptyAcquireWaitTime().Seconds())
	counter(poolCanceledDesc, float64(s.CanceledAcquireCount()))
}
