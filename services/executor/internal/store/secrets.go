package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// ErrSecretNotFound is the secret_not_found error of company's name.
func ErrSecretNotFound(company, name string) error {
	return failure.New(codes.NotFound, failure.SecretNotFound, "company %s has no secret %q (tetherctl secrets put)", company, name)
}

const putSecretSQL = `
INSERT INTO executor.secrets (company_id, name, version, key_id, data_key, sealed_value, updated_by)
VALUES ($1, $2, 1, $3, $4, $5, $6)
ON CONFLICT (company_id, name) DO UPDATE
   SET version = executor.secrets.version + 1, key_id = excluded.key_id, data_key = excluded.data_key,
       sealed_value = excluded.sealed_value, updated_by = excluded.updated_by, updated_at = now()
RETURNING version, updated_at`

// PutSecret stores a new version of company's secret name (SPEC T3).
func (s *Store) PutSecret(ctx context.Context, company, name, by string, v *SealedSecret) (*executorv1.Secret, error) {
	var (
		version uint64
		at      time.Time
	)
	if err := s.pool.QueryRow(ctx, putSecretSQL, company, name, v.KeyID, v.DataKey, v.Value, by).Scan(&version, &at); err != nil {
		return nil, err
	}
	return &executorv1.Secret{CompanyId: company, Name: name, Version: version, UpdatedAt: timestamppb.New(at), UpdatedBy: by}, nil
}

// EnsureSecret stores company's secret name unless it exists already (a
// plain configured value stored by reference: its name is a keyed digest
// of its value, so an existing one holds the same value).
func (s *Store) EnsureSecret(ctx context.Context, company, name, by string, v *SealedSecret) error {
	_, err := s.pool.Exec(ctx, `
INSERT INTO executor.secrets (company_id, name, version, key_id, data_key, sealed_value, updated_by)
VALUES ($1, $2, 1, $3, $4, $5, $6) ON CONFLICT (company_id, name) DO NOTHING`, company, name, v.KeyID, v.DataKey, v.Value, by)
	return err
}

// ListSecrets lists company's secrets by name, a page at a time (the next
// page's token, bound to the company, is "" on the last): names and versions
// only.
func (s *Store) ListSecrets(ctx context.Context, company string, pageSize int, pageToken string) ([]*executorv1.Secret, string, error) {
	if pageSize <= 0 {
		pageSize = 100
	}
	filter := filterDigest("secrets", nil, company)
	cur, _, err := decodePageToken(pageToken, filter)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.pool.Query(ctx, `SELECT name, version, updated_at, updated_by FROM executor.secrets
 WHERE company_id = $1 AND name > $2 ORDER BY name LIMIT $3`, company, cur.ID, pageSize+1)
	if err != nil {
		return nil, "", err
	}
	defer rows.Close()
	var out []*executorv1.Secret
	for rows.Next() {
		sec := &executorv1.Secret{CompanyId: company}
		var at time.Time
		if err := rows.Scan(&sec.Name, &sec.Version, &at, &sec.UpdatedBy); err != nil {
			return nil, "", err
		}
		sec.UpdatedAt = timestamppb.New(at)
		out = append(out, sec)
	}
	if err := rows.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > pageSize {
		out = out[:pageSize]
		next = encodePageToken(filter, pageCursor{ID: out[pageSize-1].GetName()})
	}
	return out, next, nil
}

// DeleteSecret deletes company's secret name.
func (s *Store) DeleteSecret(ctx context.Context, company, name string) (*executorv1.Secret, error) {
	sec := &executorv1.Secret{CompanyId: company, Name: name}
	var at time.Time
	err := s.pool.QueryRow(ctx, `DELETE FROM executor.secrets WHERE company_id = $1 AND name = $2 RETURNING version, updated_at, updated_by`,
		company, name).Scan(&sec.Version, &at, &sec.UpdatedBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrSecretNotFound(company, name)
	}
	if err != nil {
		return nil, err
	}
	sec.UpdatedAt = timestamppb.New(at)
	return sec, nil
}

// SealedSecrets reads company's secrets of names, sealed; a missing one is
// secret_not_found.
func (s *Store) SealedSecrets(ctx context.Context, company string, names []string) (map[string]*SealedSecret, error) {
	rows, err := s.pool.Query(ctx, `SELECT name, key_id, data_key, sealed_value FROM executor.secrets WHERE company_id = $1 AND name = ANY($2)`, company, names)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]*SealedSecret{}
	for rows.Next() {
		var (
			name string
			v    SealedSecret
		)
		if err := rows.Scan(&name, &v.KeyID, &v.DataKey, &v.Value); err != nil {
			return nil, err
		}
		out[name] = &v
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if out[n] == nil {
			return nil, ErrSecretNotFound(company, n)
		}
	}
	return out, nil
}
