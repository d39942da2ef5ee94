package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Bounded tables (SPEC L2). executor.events can be range-partitioned by
// run_created_at, its run's creation time (migration 00028 adds and fills
// the column): every event of a run lands in one partition, so each
// partition's own unique keys — (run_id, seq), (run_id,
// source_instance_id, source_seq), one run.terminal per run — are the
// table's, and a partition whose runs have all expired is dropped whole
// instead of deleted row by row.
//
// PartitionEvents converts the table, once, when no executor that does
// not write run_created_at is alive (`executor migrate -partition-events`):
// the table it was becomes the first partition, events_legacy, holding
// every run created before the cutoff; weekly partitions follow, created
// ahead of time (EnsureEventPartitions) by the purge job and by the step.

// PartitionWeek is the span of one partition.
const PartitionWeek = 7 * 24 * time.Hour

// PartitionsAhead is how far ahead of now partitions exist: the purge job
// (every pass, under its lease) and the partitioning step create them.
const PartitionsAhead = 8 * PartitionWeek

// LegacyPartition is the name the table from before partitioning keeps.
const LegacyPartition = "events_legacy"

// The suffixes of a weekly partition's unique indexes: events_w<date>_pkey
// (run_id, seq), events_w<date>_source_key (run_id, source_instance_id,
// source_seq), events_w<date>_one_terminal_idx (run_id) WHERE run.terminal.
const (
	partitionSourceKey   = "_source_key"
	partitionOneTerminal = "_one_terminal_idx"
)

func isPartitionIndex(name, suffix string) bool {
	return strings.HasPrefix(name, "events_w") && strings.HasSuffix(name, suffix)
}

// EventPartition is one partition of executor.events: it holds the events
// of the runs created in [From, To); From zero: the legacy partition (every
// run created before To).
type EventPartition struct {
	Name     string
	From, To time.Time
}

// EventsPartitioned reports whether executor.events is partitioned.
func (s *Store) EventsPartitioned(ctx context.Context) (bool, error) {
	var kind string
	err := s.pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'executor.events'::regclass`).Scan(&kind)
	return kind == "p", err
}

// EventPartitions lists the partitions, oldest first.
func (s *Store) EventPartitions(ctx context.Context) ([]EventPartition, error) {
	rows, err := s.pool.Query(ctx, `SELECT name, from_at, to_at FROM executor.event_partitions ORDER BY to_at`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (EventPartition, error) {
		var (
			p    EventPartition
			from *time.Time
		)
		err := r.Scan(&p.Name, &from, &p.To)
		if from != nil {
			p.From = *from
		}
		return p, err
	})
}

// WeekStart is the start (Monday 00:00 UTC) of t's week: partitions
// begin there.
func WeekStart(t time.Time) time.Time {
	t = t.UTC()
	d := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	return d.AddDate(0, 0, -((int(d.Weekday()) + 6) % 7))
}

// DefaultPartitionCutoff is where the legacy partition ends: the start of
// the first week that begins more than a day from now, so that the runs
// created while the step runs still belong to it.
func DefaultPartitionCutoff(now time.Time) time.Time {
	c := WeekStart(now).Add(PartitionWeek)
	if c.Sub(now) < 24*time.Hour {
		c = c.Add(PartitionWeek)
	}
	return c
}

func tsLiteral(t time.Time) string {
	return "'" + t.UTC().Format(time.RFC3339Nano) + "'::timestamptz"
}

// ErrOlderExecutorsAlive refuses the partitioning step while an executor
// that does not write run_created_at (an older release) is alive.
type ErrOlderExecutorsAlive struct{ Owners []string }

func (e *ErrOlderExecutorsAlive) Error() string {
	return fmt.Sprintf("executor(s) of an older release are alive (%s): they insert events without run_created_at, which a partitioned events table refuses; upgrade or stop them first (a replica that stopped uncleanly is forgotten once its heartbeat and its leases are a minute old)",
		strings.Join(e.Owners, ", "))
}

// olderExecutorsSQL lists the owners that may still insert events without
// run_created_at: replicas heard from within the last minute that never
// said they write it, and owners of unexpired leases that are not replicas
// saying so.
const olderExecutorsSQL = `
SELECT owner FROM executor.replicas
 WHERE writes_run_created_at IS NOT TRUE AND heartbeat_at > now() - interval '1 minute'
UNION
SELECT co.lease_owner FROM executor.coordinators co
 WHERE co.phase = 'observed' AND co.lease_expires_at > now() - interval '1 minute'
   AND NOT EXISTS (SELECT 1 FROM executor.replicas r WHERE r.owner = co.lease_owner AND r.writes_run_created_at)
ORDER BY 1`

func olderExecutors(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) error {
	rows, err := q.Query(ctx, olderExecutorsSQL)
	if err != nil {
		return err
	}
	owners, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(owners) > 0 {
		return &ErrOlderExecutorsAlive{Owners: owners}
	}
	return nil
}

// PartitionOptions tune PartitionEvents.
type PartitionOptions struct {
	// Cutoff ends the legacy partition (DefaultPartitionCutoff when zero);
	// it must be later than the creation of every run with events.
	Cutoff time.Time
	// BackfillRuns is how many runs' events one backfill statement fills
	// (1000 when 0).
	BackfillRuns int
	// Logf reports progress (nil: silent).
	Logf func(format string, args ...any)
}

// PartitionEvents partitions executor.events (SPEC L2); a no-op but for
// partitions ahead when it is already. It refuses while an executor of an
// older release is alive (ErrOlderExecutorsAlive). Steps: backfill
// run_created_at of the rows stored before migration 00028, run by run
// (batches of BackfillRuns, each its own transaction); add and validate a
// CHECK that bounds the key below the cutoff (a scan that does not block
// writers); then one short transaction under an ACCESS EXCLUSIVE lock of
// the table (no scan: the CHECK proves NOT NULL and the bound) renames the
// table events_legacy, creates the partitioned executor.events with the
// same columns and statement triggers, and attaches events_legacy for
// every run created before the cutoff; last, weekly partitions up to
// PartitionsAhead.
func (s *Store) PartitionEvents(ctx context.Context, o PartitionOptions) error {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	done, err := s.EventsPartitioned(ctx)
	if err != nil {
		return err
	}
	if done {
		logf("executor.events is partitioned already")
		return s.EnsureEventPartitions(ctx, time.Now().Add(PartitionsAhead))
	}
	if err := olderExecutors(ctx, s.pool); err != nil {
		return err
	}
	cutoff := o.Cutoff
	if cutoff.IsZero() {
		cutoff = DefaultPartitionCutoff(time.Now())
	}
	cutoff = cutoff.UTC().Truncate(time.Second)
	batch := o.BackfillRuns
	if batch <= 0 {
		batch = 1000
	}
	if err := s.backfillRunCreatedAt(ctx, batch, logf); err != nil {
		return err
	}
	if err := s.boundLegacyEvents(ctx, cutoff, logf); err != nil {
		return err
	}
	if err := s.swapInPartitionedEvents(ctx, cutoff, logf); err != nil {
		return err
	}
	logf("executor.events is partitioned: %s holds the runs created before %s", LegacyPartition, cutoff.Format(time.RFC3339))
	return s.EnsureEventPartitions(ctx, time.Now().Add(PartitionsAhead))
}

// backfillRunCreatedAt fills run_created_at of the event rows stored
// before migration 00028, run by run through the primary key (run_id,
// seq), batch runs per transaction.
func (s *Store) backfillRunCreatedAt(ctx context.Context, batch int, logf func(string, ...any)) error {
	var last, filled int64
	for {
		var upto, n int64
		err := s.pool.QueryRow(ctx, `
WITH b AS (SELECT run_id, created_at, submit_seq FROM executor.runs WHERE submit_seq > $1 ORDER BY submit_seq LIMIT $2),
u AS (UPDATE executor.events e SET run_created_at = b.created_at FROM b
       WHERE e.run_id = b.run_id AND e.run_created_at IS NULL RETURNING 1)
SELECT coalesce((SELECT max(submit_seq) FROM b), 0), (SELECT count(*) FROM u)`, last, batch).Scan(&upto, &n)
		if err != nil {
			return fmt.Errorf("backfilling run_created_at: %w", err)
		}
		if upto == 0 {
			break
		}
		last, filled = upto, filled+n
	}
	logf("backfilled run_created_at of %d event rows", filled)
	return nil
}

// boundLegacyEvents adds and validates, without blocking writers, the
// CHECK that every stored event belongs to a run created before cutoff
// (and has run_created_at).
func (s *Store) boundLegacyEvents(ctx context.Context, cutoff time.Time, logf func(string, ...any)) error {
	check := fmt.Sprintf(`ALTER TABLE executor.events ADD CONSTRAINT events_legacy_bound CHECK (run_created_at IS NOT NULL AND run_created_at < %s) NOT VALID`, tsLiteral(cutoff))
	if _, err := s.pool.Exec(ctx, `ALTER TABLE executor.events DROP CONSTRAINT IF EXISTS events_legacy_bound`); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, check); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, `ALTER TABLE executor.events VALIDATE CONSTRAINT events_legacy_bound`); err != nil {
		_, _ = s.pool.Exec(context.WithoutCancel(ctx), `ALTER TABLE executor.events DROP CONSTRAINT IF EXISTS events_legacy_bound`)
		return fmt.Errorf("events of runs created at or after the cutoff %s are stored (or rows lack run_created_at): %w", cutoff.Format(time.RFC3339), err)
	}
	logf("validated: every stored event belongs to a run created before %s", cutoff.Format(time.RFC3339))
	return nil
}

// swapInPartitionedEvents is the swap: short, under the table's lock;
// retried when the lock is not granted within lock_timeout (writers queue
// behind a waiting ACCESS EXCLUSIVE request).
func (s *Store) swapInPartitionedEvents(ctx context.Context, cutoff time.Time, logf func(string, ...any)) error {
	for attempt := 1; ; attempt++ {
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '2s'`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `LOCK TABLE executor.events IN ACCESS EXCLUSIVE MODE`); err != nil {
				return err
			}
			if err := olderExecutors(ctx, tx); err != nil {
				return err
			}
			for _, q := range []string{
				`ALTER TABLE executor.events ALTER COLUMN run_created_at SET NOT NULL`,
				`DROP TRIGGER events_run_created_at ON executor.events`,
				`DROP TRIGGER events_run_refs ON executor.events`,
				`DROP TRIGGER events_within_fence ON executor.events`,
				`DROP TRIGGER events_run_id_fixed ON executor.events`,
				`ALTER TABLE executor.events RENAME TO ` + LegacyPartition,
				`CREATE TABLE executor.events (LIKE executor.` + LegacyPartition + ` INCLUDING DEFAULTS) PARTITION BY RANGE (run_created_at)`,
				fmt.Sprintf(`ALTER TABLE executor.events ATTACH PARTITION executor.%s FOR VALUES FROM (MINVALUE) TO (%s)`, LegacyPartition, tsLiteral(cutoff)),
				`ALTER TABLE executor.` + LegacyPartition + ` DROP CONSTRAINT events_legacy_bound`,
				`CREATE TRIGGER events_run_refs AFTER INSERT ON executor.events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION executor.check_event_run_refs()`,
				`CREATE TRIGGER events_within_fence AFTER INSERT ON executor.events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION executor.check_event_fence()`,
				`CREATE TRIGGER events_run_id_fixed BEFORE UPDATE OF run_id ON executor.events
    FOR EACH STATEMENT EXECUTE FUNCTION executor.refuse_run_id_update()`,
			} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return fmt.Errorf("%s: %w", strings.SplitN(q, "\n", 2)[0], err)
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO executor.event_partitions (name, from_at, to_at) VALUES ($1, NULL, $2)`, LegacyPartition, cutoff)
			return err
		})
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" && attempt < 30 {
			logf("the events table is busy (lock not granted within 2 s): retrying")
			continue
		}
		if err != nil {
			return fmt.Errorf("partitioning executor.events: %w", err)
		}
		break
	}
	return nil
}

// EnsureEventPartitions creates weekly partitions after the last one until
// one ends after until (no-op on an unpartitioned table). Each is created
// as a table with its unique indexes and then attached, which takes only a
// SHARE UPDATE EXCLUSIVE lock of executor.events (writers go on).
func (s *Store) EnsureEventPartitions(ctx context.Context, until time.Time) error {
	done, err := s.EventsPartitioned(ctx)
	if err != nil || !done {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('executor.event_partitions'))`); err != nil {
			return err
		}
		var last time.Time
		if err := tx.QueryRow(ctx, `SELECT max(to_at) FROM executor.event_partitions`).Scan(&last); err != nil {
			return err
		}
		for from := last; !from.After(until); from = from.Add(PartitionWeek) {
			to := from.Add(PartitionWeek)
			name := "events_w" + from.UTC().Format("20060102")
			if !WeekStart(from).Equal(from) {
				// A cutoff not on a week's start: the first partition
				// runs to the next week's start.
				to = WeekStart(from).Add(PartitionWeek)
				name = "events_w" + from.UTC().Format("20060102t150405")
			}
			id := pgx.Identifier{"executor", name}.Sanitize()
			for _, q := range []string{
				`CREATE TABLE ` + id + ` (LIKE executor.events INCLUDING DEFAULTS)`,
				`ALTER TABLE ` + id + ` ADD CONSTRAINT ` + pgx.Identifier{name + "_pkey"}.Sanitize() + ` PRIMARY KEY (run_id, seq),
   ADD CONSTRAINT ` + pgx.Identifier{name + partitionSourceKey}.Sanitize() + ` UNIQUE (run_id, source_instance_id, source_seq)`,
				`CREATE UNIQUE INDEX ` + pgx.Identifier{name + partitionOneTerminal}.Sanitize() + ` ON ` + id + ` (run_id) WHERE event_type = 'run.terminal'`,
				fmt.Sprintf(`ALTER TABLE executor.events ATTACH PARTITION %s FOR VALUES FROM (%s) TO (%s)`, id, tsLiteral(from), tsLiteral(to)),
			} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return fmt.Errorf("creating partition %s: %w", name, err)
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO executor.event_partitions (name, from_at, to_at) VALUES ($1, $2, $3)`, name, from, to); err != nil {
				return err
			}
			from = to.Add(-PartitionWeek)
		}
		return nil
	})
}

// expiredRunSQL is true for run r (with r's company policy own and the
// default d joined) when the purge may delete it: ended, past its
// company's retention, not its scope's newest run, named by no checkpoint
// (ExpiredRuns' rules).
const expiredRunSQL = `(r.ended_at IS NOT NULL
     AND r.ended_at < now() - make_interval(secs => CASE WHEN own.company_id IS NULL THEN d.runs_retention_secs ELSE own.runs_retention_secs END)
     AND EXISTS (SELECT 1 FROM executor.coordinators co WHERE co.run_id = r.run_id AND co.phase IN ('completed', 'terminal_failure'))
     AND EXISTS (SELECT 1 FROM executor.runs n WHERE n.session_scope = r.session_scope AND n.submit_seq > r.submit_seq)
     AND NOT EXISTS (SELECT 1 FROM executor.session_checkpoints k WHERE k.last_run_id = r.run_id))`

// partitionExpiredSQL is true when every run created in [$1, $2) may be
// deleted. $1 NULL (the legacy partition, which the row-wise purge
// empties of expired runs): when no run created before $2 is left, a
// check that stays one index probe however much history the table had.
const partitionExpiredSQL = `
SELECT CASE WHEN $1::timestamptz IS NULL THEN NOT EXISTS (SELECT 1 FROM executor.runs WHERE created_at < $2)
  ELSE NOT EXISTS (
  SELECT 1 FROM executor.runs r
    JOIN executor.retention_settings d ON d.company_id = '*'
    LEFT JOIN executor.retention_settings own ON own.company_id = r.company_id
   WHERE r.created_at >= $1 AND r.created_at < $2
     AND NOT coalesce(` + expiredRunSQL + `, false)) END`

// DropExpiredEventPartitions drops the partitions whose runs have all
// expired (ExpiredRuns' rules), oldest first, each at least an hour past
// its end: the check is repeated under a short ACCESS EXCLUSIVE lock of
// executor.events (lock_timeout 2 s; a busy table is tried again next
// pass), then the partition is detached and dropped — one catalog change
// whatever its size. The runs' own rows (runs, coordinators, activities,
// interactions) are left to the row-wise purge, which finds them without
// events. A partition holding a run the purge keeps (a session's newest,
// a checkpointed one, a company's without retention) stays; its expired
// runs go row by row once it is past the longest retention (ExpiredRuns).
func (s *Store) DropExpiredEventPartitions(ctx context.Context) ([]EventPartition, error) {
	parts, err := s.EventPartitions(ctx)
	if err != nil {
		return nil, err
	}
	var dropped []EventPartition
	for _, p := range parts {
		if time.Since(p.To) < time.Hour {
			break
		}
		var from any
		if !p.From.IsZero() {
			from = p.From
		}
		var expired bool
		if err := s.pool.QueryRow(ctx, partitionExpiredSQL, from, p.To).Scan(&expired); err != nil {
			return dropped, err
		}
		if !expired {
			continue
		}
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '2s'`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `LOCK TABLE executor.events IN ACCESS EXCLUSIVE MODE`); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, partitionExpiredSQL, from, p.To).Scan(&expired); err != nil || !expired {
				return err
			}
			id := pgx.Identifier{"executor", p.Name}.Sanitize()
			for _, q := range []string{`ALTER TABLE executor.events DETACH PARTITION ` + id, `DROP TABLE ` + id} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `DELETE FROM executor.event_partitions WHERE name = $1`, p.Name)
			return err
		})
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			return dropped, nil
		}
		if err != nil {
			return dropped, fmt.Errorf("dropping partition %s: %w", p.Name, err)
		}
		if expired {
			dropped = append(dropped, p)
		}
	}
	return dropped, nil
}
