-- +goose NO TRANSACTION
-- +goose Up
-- SPEC L2: a partition's runs by creation time (has every one of them
-- expired?). Built concurrently: appends keep updating runs meanwhile.
CREATE INDEX CONCURRENTLY IF NOT EXISTS runs_created_at_idx ON executor.runs (created_at);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS executor.runs_created_at_idx;
