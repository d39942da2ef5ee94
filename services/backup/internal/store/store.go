// Package store keeps the backup verifier's metadata in PostgreSQL (schema
// backup): one row per stored checkpoint with its canonical manifest, and
// the stamps issued for it. Archives themselves live in the blob store.
package store

import (
	"context"
	"embed"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tether-run/tether/pkg/pgstore"
)

// Migrations holds the embedded, numbered goose migrations.
//
//go:embed migrations/*.sql
var Migrations embed.FS

// GooseTable is the goose version table of this schema.
const GooseTable = "backup_goose_version"

// ErrNotFound is returned for an unknown checkpoint.
var ErrNotFound = errors.New("checkpoint not found")

// Schema is the verifier's migrations (`backup-verifier migrate`, SPEC L3).
var Schema = pgstore.Migrations{FS: Migrations, Dir: "migrations", Table: GooseTable}

// Migrate applies the embedded migrations to the database at dsn.
func Migrate(ctx context.Context, dsn string) error { return pgstore.Migrate(ctx, dsn, Schema) }

// CheckSchema fails with schema_outdated when the database at dsn lacks a
// migration this verifier needs (started with -migrate=false, SPEC L3).
func CheckSchema(ctx context.Context, dsn string) error {
	return pgstore.CheckCurrent(ctx, dsn, Schema, "backup-verifier migrate -database-url URL")
}

// Store is the verifier's PostgreSQL access.
type Store struct{ pool *pgxpool.Pool }

// Ping checks that the database answers (the verifier's readiness, SPEC D5).
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// Pool exposes the pool (for its metrics).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Open connects a pool to dsn.
func Open(ctx context.Context, dsn string) (*Store, error) {
	pool, err := pgstore.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool}, nil
}

// New wraps an existing pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// Checkpoint is a stored checkpoint's metadata.
type Checkpoint struct {
	ID                  string
	SessionScope        string
	NormalizedSessionID string
	RunnerInstanceID    string
	SourceLeaseID       string
	ProviderKind        string
	DriverKind          string
	// Manifest is the manifest's canonical JSON.
	Manifest       []byte
	ManifestDigest string
	BlobKey        string
	ArchiveSHA256  string
	ArchiveBytes   int64
	ExpandedBytes  int64
	Entries        int
	CompletedAt    time.Time
	CreatedAt      time.Time
	// DigestRules are the rules its directory digests were computed with
	// (archive.DigestRules); 0: not recorded (stored before SPEC L5).
	DigestRules int
}

// Insert records a checkpoint and the stamp issued for stampLease, in one
// transaction.
func (s *Store) Insert(ctx context.Context, c *Checkpoint, stampLease string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
INSERT INTO backup.checkpoints (checkpoint_id, session_scope, normalized_session_id, runner_instance_id,
    source_lease_id, provider_kind, driver_kind, manifest, manifest_digest, blob_key, archive_sha256,
    archive_bytes, expanded_bytes, entries, completed_at, digest_rules)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, NULLIF($16, 0))
RETURNING created_at`,
			c.ID, c.SessionScope, c.NormalizedSessionID, c.RunnerInstanceID, c.SourceLeaseID, c.ProviderKind,
			c.DriverKind, c.Manifest, c.ManifestDigest, c.BlobKey, c.ArchiveSHA256, c.ArchiveBytes,
			c.ExpandedBytes, c.Entries, c.CompletedAt, c.DigestRules).Scan(&c.CreatedAt)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO backup.stamps (checkpoint_id, lease_id) VALUES ($1, $2)`, c.ID, stampLease)
		return err
	})
}

const columns = `checkpoint_id, session_scope, normalized_session_id, runner_instance_id, source_lease_id,
    provider_kind, driver_kind, manifest, manifest_digest, blob_key, archive_sha256, archive_bytes,
    expanded_bytes, entries, completed_at, created_at, coalesce(digest_rules, 0)`

func scan(row pgx.Row) (*Checkpoint, error) {
	var c Checkpoint
	err := row.Scan(&c.ID, &c.SessionScope, &c.NormalizedSessionID, &c.RunnerInstanceID, &c.SourceLeaseID,
		&c.ProviderKind, &c.DriverKind, &c.Manifest, &c.ManifestDigest, &c.BlobKey, &c.ArchiveSHA256,
		&c.ArchiveBytes, &c.ExpandedBytes, &c.Entries, &c.CompletedAt, &c.CreatedAt, &c.DigestRules)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// Get returns the checkpoint with this id.
func (s *Store) Get(ctx context.Context, id string) (*Checkpoint, error) {
	return scan(s.pool.QueryRow(ctx, `SELECT `+columns+` FROM backup.checkpoints WHERE checkpoint_id = $1`, id))
}

// GetByManifestDigest returns the checkpoint whose manifest has this digest.
func (s *Store) GetByManifestDigest(ctx context.Context, d string) (*Checkpoint, error) {
	return scan(s.pool.QueryRow(ctx, `SELECT `+columns+` FROM backup.checkpoints WHERE manifest_digest = $1`, d))
}

// Latest returns the newest checkpoint of a session scope.
func (s *Store) Latest(ctx context.Context, scope string) (*Checkpoint, error) {
	return scan(s.pool.QueryRow(ctx, `SELECT `+columns+` FROM backup.checkpoints WHERE session_scope = $1
ORDER BY created_at DESC, checkpoint_id DESC LIMIT 1`, scope))
}

// RecordStamp records that a stamp for lease was issued for a checkpoint
// (idempotent).
func (s *Store) RecordStamp(ctx context.Context, checkpointID, lease string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO backup.stamps (checkpoint_id, lease_id) VALUES ($1, $2)
ON CONFLICT DO NOTHING`, checkpointID, lease)
	return err
}

// Stamps lists the leases stamps were issued for, oldest first.
func (s *Store) Stamps(ctx context.Context, checkpointID string) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT lease_id FROM backup.stamps WHERE checkpoint_id = $1 ORDER BY issued_at, lease_id`, checkpointID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// RecordDigestRules records the rules a checkpoint stored before they were
// recorded turned out to verify under (SPEC L5); a recorded value stays.
func (s *Store) RecordDigestRules(ctx context.Context, id string, rules int) error {
	_, err := s.pool.Exec(ctx, `UPDATE backup.checkpoints SET digest_rules = $2 WHERE checkpoint_id = $1 AND digest_rules IS NULL`, id, rules)
	return err
}

// Doomed is a checkpoint about to be deleted: its id and archive.
type Doomed struct {
	ID, BlobKey  string
	ArchiveBytes int64
}

// Doomed lists the checkpoints named by id or by session scope (SPEC L1).
func (s *Store) Doomed(ctx context.Context, ids, scopes []string) ([]Doomed, error) {
	rows, err := s.pool.Query(ctx, `SELECT checkpoint_id, blob_key, archive_bytes FROM backup.checkpoints
 WHERE checkpoint_id = ANY($1) OR session_scope = ANY($2) ORDER BY checkpoint_id`, ids, scopes)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Doomed, error) {
		var d Doomed
		return d, r.Scan(&d.ID, &d.BlobKey, &d.ArchiveBytes)
	})
}

// Delete deletes a checkpoint's record and its stamps (the caller deleted
// its archive first); false when it was already gone.
func (s *Store) Delete(ctx context.Context, id string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM backup.checkpoints WHERE checkpoint_id = $1`, id)
	return tag.RowsAffected() == 1, err
}
