-- +goose Up
-- SPEC L5: the rules a checkpoint's directory digests were computed with
-- (pkg/archive DigestRules: 1 raw directory modes, 2 SafeDirMode). NULL:
-- stored before the rules were recorded; its verification tries the
-- current rules, then the older ones, and records the rules that match.
ALTER TABLE backup.checkpoints ADD COLUMN digest_rules smallint CHECK (digest_rules IN (1, 2));

-- +goose Down
ALTER TABLE backup.checkpoints DROP COLUMN digest_rules;
