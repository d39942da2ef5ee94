-- +goose Up
-- The PID namespace the lease holder's pid is valid in (SPEC F5): a
-- successor on the same host (same boot id) proves the holder dead by pid
-- only from the same namespace; NULL (a holder recorded before this column)
-- is never proven dead by pid, its lease expires instead.
ALTER TABLE executor.coordinators ADD COLUMN controller_pid_ns text;

-- +goose Down
ALTER TABLE executor.coordinators DROP COLUMN controller_pid_ns;
