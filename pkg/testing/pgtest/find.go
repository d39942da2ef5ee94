package pgtest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Querier runs queries (a pgx connection or pool).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// FindInDatabase returns the columns ("schema.table.column") of the tables
// of schemas in which some row holds needle: in a text, JSON or character
// column as text, in a bytea column (protobuf messages, sealed values) as
// its UTF-8 bytes. A test that a value is written nowhere asks it of every
// schema the services write.
func FindInDatabase(ctx context.Context, db Querier, needle string, schemas ...string) ([]string, error) {
	rows, err := db.Query(ctx, `
SELECT c.table_schema, c.table_name, c.column_name, c.data_type
  FROM information_schema.columns c
  JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name AND t.table_type = 'BASE TABLE'
 WHERE c.table_schema = ANY($1)
   AND c.data_type IN ('bytea', 'text', 'character varying', 'jsonb', 'json', 'ARRAY')
 ORDER BY 1, 2, 3`, schemas)
	if err != nil {
		return nil, err
	}
	type col struct{ schema, table, column, typ string }
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (col, error) {
		var c col
		return c, r.Scan(&c.schema, &c.table, &c.column, &c.typ)
	})
	if err != nil {
		return nil, err
	}
	var hits []string
	for _, c := range cols {
		ref := pgx.Identifier{c.schema, c.table}.Sanitize()
		name := pgx.Identifier{c.column}.Sanitize()
		cond := fmt.Sprintf("strpos(%s::text, $1) > 0", name)
		if c.typ == "bytea" {
			cond = fmt.Sprintf("position(convert_to($1, 'UTF8') in %s) > 0", name)
		}
		var found bool
		if err := db.QueryRow(ctx, fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE %s)", ref, cond), needle).Scan(&found); err != nil {
			return nil, fmt.Errorf("%s.%s: %w", ref, name, err)
		}
		if found {
			hits = append(hits, c.schema+"."+c.table+"."+c.column)
		}
	}
	return hits, nil
}
