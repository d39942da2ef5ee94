-- +goose Up
-- The runner gateway registry (SPEC F1): each runnergw announces itself and
-- heartbeats through an executor; its state follows from the heartbeat
-- (lost past the TTL) and the draining flag.
CREATE TABLE executor.gateways (
    gateway_id    text PRIMARY KEY,
    address       text NOT NULL,
    labels        jsonb NOT NULL DEFAULT '{}',
    capacity      integer NOT NULL CHECK (capacity > 0),
    sessions      integer NOT NULL DEFAULT 0 CHECK (sessions >= 0),
    draining      boolean NOT NULL DEFAULT false,
    registered_at timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE executor.gateways;
