// Package retention runs the executor's retention purge (SPEC L1): on one
// replica of the fleet at a time (a lease in executor.job_leases) it deletes
// the checkpoints past each company's CheckpointsKept — their archives
// through the backup verifier first, which owns them, then the executor's
// records — and the ended runs past each company's run retention, with
// their events, activities and interactions, in bounded batches paced so
// that the hot path (event appends, claims) keeps most of the database.
//
// What is kept whatever the policy is decided by the store's queries
// (store/retention.go): the newest run of each session, the checkpoint a
// session restores from, the runs checkpoints name.
package retention

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	"github.com/tether-run/tether/services/executor/internal/store"

	"google.golang.org/grpc/codes"
)

// Job is the purge's name in executor.job_leases.
const Job = "retention-purge"

// CheckpointDeleter deletes stored checkpoints (their archives and the
// verifier's records): by id, and every checkpoint of the named scopes.
type CheckpointDeleter interface {
	DeleteCheckpoints(ctx context.Context, ids, scopes []string) error
}

// Verifier deletes checkpoints through the backup verifier's API.
type Verifier struct {
	Client backupv1.BackupVerifierClient
}

// maxPerCall is the verifier's bound on ids or scopes per call.
const maxPerCall = 1000

// DeleteCheckpoints asks the verifier, at most maxPerCall names a call.
func (v Verifier) DeleteCheckpoints(ctx context.Context, ids, scopes []string) error {
	for len(ids) > 0 || len(scopes) > 0 {
		req := &backupv1.DeleteCheckpointsRequest{}
		n := min(len(ids), maxPerCall)
		req.CheckpointIds, ids = ids[:n], ids[n:]
		m := min(len(scopes), maxPerCall)
		req.SessionScopes, scopes = scopes[:m], scopes[m:]
		if _, err := v.Client.DeleteCheckpoints(ctx, req); err != nil {
			return failure.Wrap(err, codes.Unavailable, failure.CheckpointDeletionUnavailable, "the backup verifier did not delete checkpoints")
		}
	}
	return nil
}

// ErrNoVerifier refuses a deletion that must delete checkpoint archives
// when the executor has no backup verifier to delete them with.
func ErrNoVerifier() error {
	return failure.New(codes.FailedPrecondition, failure.CheckpointDeletionUnavailable,
		"checkpoints must be deleted and this executor has no backup verifier (-backup-addr) to delete their archives")
}

// Defaults of Purger.
const (
	DefaultInterval    = time.Minute
	DefaultBatchRuns   = 100
	DefaultBatchEvents = 5000
	// DefaultDuty: the purge works at most a tenth of the time while it
	// has work, sleeping nine times as long as each batch took, so that it
	// takes at most about a tenth of the database from the hot path (SPEC
	// L1: ≤ 10 %; make bench's purge_impact measures it). At 5,000 events
	// a batch that is still tens of thousands of events a minute.
	DefaultDuty = 0.1
)

// Purger is the retention purge of one executor replica.
type Purger struct {
	Store *store.Store
	// Checkpoints deletes archives; nil: checkpoints are not pruned (runs
	// a checkpoint names are kept with it).
	Checkpoints CheckpointDeleter
	// Owner is this replica's lease owner id.
	Owner string
	// Interval between passes (DefaultInterval when 0).
	Interval time.Duration
	// BatchRuns and BatchEvents bound one batch (one transaction): at most
	// so many runs holding at most so many events (a bigger run alone).
	BatchRuns   int
	BatchEvents int64
	// Duty is the share of time the purge works while it has work (0..1,
	// DefaultDuty when 0): after a batch of duration d it sleeps
	// d*(1-Duty)/Duty.
	Duty   float64
	Logger *slog.Logger
	// Deleted counts what the purge deleted, by kind (nil: not counted).
	Deleted *prometheus.CounterVec
	// Batched, when set, is called after each batch (tests).
	Batched func(store.PurgeCounts)
}

// NewMetrics registers the purge's counter.
func NewMetrics(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_retention_deleted_total",
		Help: "Rows (and checkpoint archives) the retention purge deleted, by kind (SPEC L1).",
	}, []string{"kind"})
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}

func (p *Purger) interval() time.Duration {
	if p.Interval > 0 {
		return p.Interval
	}
	return DefaultInterval
}

func (p *Purger) leaseTTL() time.Duration { return max(3*p.interval(), 30*time.Second) }

func (p *Purger) log() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.Default()
}

// Run purges every Interval while this replica holds the purge's lease,
// until ctx ends (then it gives the lease back).
func (p *Purger) Run(ctx context.Context) {
	t := time.NewTicker(p.interval())
	defer t.Stop()
	defer func() { _ = p.Store.ReleaseJobLease(context.WithoutCancel(ctx), Job, p.Owner) }()
	for {
		if held, err := p.Store.TakeJobLease(ctx, Job, p.Owner, p.leaseTTL()); err != nil {
			if ctx.Err() == nil {
				p.log().Warn("retention purge: lease", "err", err)
			}
		} else if held {
			if c, err := p.Pass(ctx); err != nil && ctx.Err() == nil {
				p.log().Warn("retention purge failed", "err", err)
			} else if c.Runs > 0 || c.Checkpoints > 0 || c.Partitions > 0 {
				p.log().Info("retention purge", "runs", c.Runs, "events", c.Events, "activities", c.Activities,
					"interactions", c.Interactions, "checkpoints", c.Checkpoints, "event_partitions", c.Partitions)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pass deletes what is past retention now: checkpoints first (their runs
// become deletable), then runs, batch by batch, pacing itself (Duty) and
// renewing the lease between batches; it stops when nothing is left, ctx
// ends or the lease is lost.
func (p *Purger) Pass(ctx context.Context) (store.PurgeCounts, error) {
	var total store.PurgeCounts
	batchRuns, batchEvents := p.BatchRuns, p.BatchEvents
	if batchRuns <= 0 {
		batchRuns = DefaultBatchRuns
	}
	if batchEvents <= 0 {
		batchEvents = DefaultBatchEvents
	}
	duty := p.Duty
	if duty <= 0 || duty > 1 {
		duty = DefaultDuty
	}
	batch := func(do func() (store.PurgeCounts, error)) (bool, error) {
		start := time.Now()
		c, err := do()
		if err != nil {
			return false, err
		}
		total.Add(c)
		p.count(c)
		if p.Batched != nil {
			p.Batched(c)
		}
		if c.Runs == 0 && c.Checkpoints == 0 {
			return false, nil
		}
		if err := sleep(ctx, time.Duration(float64(time.Since(start))*(1-duty)/duty)); err != nil {
			return false, err
		}
		held, err := p.Store.TakeJobLease(ctx, Job, p.Owner, p.leaseTTL())
		if err == nil && !held {
			err = fmt.Errorf("the purge's lease was taken over")
		}
		return err == nil, err
	}
	// SPEC L2: partitions ahead, then whole expired partitions, before
	// the row-wise batches.
	if err := p.Store.EnsureEventPartitions(ctx, time.Now().Add(store.PartitionsAhead)); err != nil {
		return total, fmt.Errorf("creating events partitions: %w", err)
	}
	dropped, err := p.Store.DropExpiredEventPartitions(ctx)
	if len(dropped) > 0 {
		c := store.PurgeCounts{Partitions: int64(len(dropped))}
		total.Add(c)
		p.count(c)
		for _, d := range dropped {
			p.log().Info("retention purge: dropped an expired events partition", "partition", d.Name, "runs_created_before", d.To)
		}
	}
	if err != nil {
		return total, err
	}
	if p.Checkpoints != nil {
		for {
			more, err := batch(func() (store.PurgeCounts, error) { return p.pruneCheckpoints(ctx, batchRuns) })
			if err != nil || !more {
				if err != nil {
					return total, err
				}
				break
			}
		}
	}
	for {
		more, err := batch(func() (store.PurgeCounts, error) {
			ids, err := p.Store.ExpiredRuns(ctx, batchRuns, batchEvents)
			if err != nil || len(ids) == 0 {
				return store.PurgeCounts{}, err
			}
			return p.Store.PurgeRuns(ctx, ids)
		})
		if err != nil || !more {
			return total, err
		}
	}
}

// pruneCheckpoints deletes up to limit checkpoints past retention: the
// verifier deletes each archive and its record, then the executor forgets
// it (a pass cut short between the two deletes it again next time: the
// verifier skips what it no longer has).
func (p *Purger) pruneCheckpoints(ctx context.Context, limit int) (store.PurgeCounts, error) {
	cps, err := p.Store.PrunableCheckpoints(ctx, limit)
	if err != nil || len(cps) == 0 {
		return store.PurgeCounts{}, err
	}
	ids := make([]string, len(cps))
	for i, c := range cps {
		ids[i] = c.ID
	}
	if err := p.Checkpoints.DeleteCheckpoints(ctx, ids, nil); err != nil {
		return store.PurgeCounts{}, err
	}
	n, err := p.Store.ForgetCheckpoints(ctx, ids)
	return store.PurgeCounts{Checkpoints: n}, err
}

func (p *Purger) count(c store.PurgeCounts) {
	if p.Deleted == nil {
		return
	}
	for kind, n := range map[string]int64{"runs": c.Runs, "events": c.Events, "activities": c.Activities,
		"interactions": c.Interactions, "checkpoints": c.Checkpoints, "event_partitions": c.Partitions} {
		if n > 0 {
			p.Deleted.WithLabelValues(kind).Add(float64(n))
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// PurgeCompany deletes everything the executor keeps of company (SPEC L1),
// in batches of batchRuns runs: refused while a run of it is queued or
// running. Checkpoint archives go first, through del (nil: refused when
// the company has checkpoints or runs, which may have some the executor
// never recorded).
func PurgeCompany(ctx context.Context, st *store.Store, del CheckpointDeleter, company, by, reason string, batchRuns int) (store.PurgeCounts, error) {
	if err := st.CheckCompanyIdle(ctx, company); err != nil {
		return store.PurgeCounts{}, err
	}
	scopes, err := st.CompanyScopes(ctx, company)
	if err != nil {
		return store.PurgeCounts{}, err
	}
	if len(scopes) > 0 {
		if del == nil {
			return store.PurgeCounts{}, ErrNoVerifier()
		}
		if err := del.DeleteCheckpoints(ctx, nil, scopes); err != nil {
			return store.PurgeCounts{}, err
		}
	}
	var total store.PurgeCounts
	for {
		c, err := st.PurgeCompanyBatch(ctx, company, batchRuns)
		if err != nil {
			return total, err
		}
		total.Add(c)
		if c.Runs == 0 {
			break
		}
	}
	return st.FinishCompanyPurge(ctx, company, scopes, total, by, reason)
}
