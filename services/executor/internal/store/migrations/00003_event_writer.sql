-- +goose Up
-- The lease attempt whose driver wrote each event (0: written outside a
-- lease, e.g. by CancelRun on a queued run), so fencing can be audited.
ALTER TABLE executor.events ADD COLUMN writer_attempt bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE executor.events DROP COLUMN writer_attempt;
