package main

// -pg-statements N: where the database's share of a warm turn goes. The
// bench's cluster loads pg_stat_statements (tracking nested statements too:
// triggers' and functions' own), the counters are reset before the warm
// turns, and after them the N statements that took the most execution time
// are printed per stack turn (calls, total and mean), with the sum over every
// statement. Execution time only: parsing, planning and the commit's WAL
// flush are not in it.

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tether-run/tether/pkg/testing/pgtest"
)

// pgStatementsOptions are the cluster settings -pg-statements needs.
func pgStatementsOptions() []pgtest.Option {
	return []pgtest.Option{
		pgtest.WithSetting("shared_preload_libraries", "'pg_stat_statements'"),
		pgtest.WithSetting("pg_stat_statements.track", "all"),
		pgtest.WithSetting("pg_stat_statements.max", "5000"),
	}
}

// pgStatements resets and then reads pg_stat_statements of one database.
type pgStatements struct {
	pool *pgxpool.Pool
}

func openPgStatements(ctx context.Context, dsn string) (*pgStatements, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	return &pgStatements{pool: pool}, nil
}

func (p *pgStatements) close() { p.pool.Close() }

func (p *pgStatements) reset(ctx context.Context) error {
	_, err := p.pool.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	return err
}

// print prints the top statements of the database per turn (turns: the stack
// turns run since the reset). The bench's own statements (this pool's, the
// anchors') are left out by their text.
func (p *pgStatements) print(ctx context.Context, turns, top int) error {
	rows, err := p.pool.Query(ctx, `
		SELECT s.calls, s.total_exec_time, s.rows, s.toplevel, s.query
		FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
		WHERE d.datname = current_database()
		  AND s.query NOT ILIKE '%pg_stat_statements%' AND s.query NOT ILIKE '%anchor%'
		ORDER BY s.total_exec_time DESC`)
	if err != nil {
		return err
	}
	defer rows.Close()
	type stmt struct {
		calls, rows int64
		total       float64
		toplevel    bool
		query       string
	}
	var all []stmt
	var sumTop, sumNested float64
	var callsTop, callsNested int64
	for rows.Next() {
		var s stmt
		if err := rows.Scan(&s.calls, &s.total, &s.rows, &s.toplevel, &s.query); err != nil {
			return err
		}
		all = append(all, s)
		if s.toplevel {
			sumTop += s.total
			callsTop += s.calls
		} else {
			sumNested += s.total
			callsNested += s.calls
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	n := float64(turns)
	fmt.Printf("\nPostgreSQL statements per stack turn (pg_stat_statements over %d turns, execution time only; nested = run by a trigger or function, inside a top-level one's time):\n", turns)
	fmt.Printf("  top-level: %.1f calls, %.3f ms per turn; nested: %.1f calls, %.3f ms per turn\n", float64(callsTop)/n, sumTop/n, float64(callsNested)/n, sumNested/n)
	fmt.Printf("  %8s %9s %8s %7s  %s\n", "calls/t", "ms/turn", "mean ms", "rows/c", "statement")
	for i, s := range all {
		if i == top {
			break
		}
		kind := ""
		if !s.toplevel {
			kind = "[nested] "
		}
		q := strings.Join(strings.Fields(s.query), " ")
		if len(q) > 140 {
			q = q[:140] + "…"
		}
		rowsPer := 0.0
		if s.calls > 0 {
			rowsPer = float64(s.rows) / float64(s.calls)
		}
		fmt.Printf("  %8.2f %9.3f %8.3f %7.1f  %s%s\n", float64(s.calls)/n, s.total/n, s.total/float64(max(s.calls, 1)), rowsPer, kind, q)
	}
	fmt.Printf("BENCH warm_turn_pg_statements calls_per_turn=%.1f exec_ms_per_turn=%.3f nested_calls_per_turn=%.1f\n", float64(callsTop)/n, sumTop/n, float64(callsNested)/n)
	return nil
}
