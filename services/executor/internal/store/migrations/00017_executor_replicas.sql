-- +goose Up
-- The PID namespace the lease holder's pid is valid in (SPEC F5): a
-- successor on the same host (same boot id) proves the holder dead by pid
-- only from the same namespace; NULL (a holder recorded before this column)
-- is never proven dead by pid, its lease expires instead.
ALTER TABLE executor.coordinators ADD COLUMN controller_pid_ns text;

-- The executor replicas that claim runs (SPEC F6): each heartbeats its
-- capacity (runs it drives at once), so a replica claims only up to its
-- fair share of the runs the live fleet drives.
CREATE TABLE executor.replicas (
    owner        text PRIMARY KEY,
    capacity     integer NOT NULL CHECK (capacity > 0),
    addr         text,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE executor.replicas;
ALTER TABLE executor.coordinators DROP COLUMN controller_pid_ns;
