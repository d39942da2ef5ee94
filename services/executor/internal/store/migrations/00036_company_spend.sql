-- +goose Up
-- SPEC Q2: a company's settled spend per calendar month (UTC), kept exactly
-- once. A run's cost is added in the transaction that settles it (its
-- terminal commit, fenced), and only when runs.spend_month was still NULL
-- (it is set there): a replayed or taken-over terminal adds nothing.
ALTER TABLE executor.runs ADD COLUMN spend_month date;

-- warned_at / exhausted_at: when the month's spend first reached the warn
-- ratio of the budget / the budget (each recorded once a month, with an
-- operator_actions row budget.warning / budget.exhausted).
CREATE TABLE executor.company_spend (
    company_id   text NOT NULL,
    month        date NOT NULL,
    spend_usd    numeric NOT NULL DEFAULT 0 CHECK (spend_usd >= 0),
    runs         bigint NOT NULL DEFAULT 0,
    warned_at    timestamptz,
    exhausted_at timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (company_id, month)
);
CREATE INDEX company_spend_month_idx ON executor.company_spend (month);

-- SPEC Q4: submissions refused by a limit or the budget, per company and
-- reason, for every replica (GetCompanyUsage, the metrics).
CREATE TABLE executor.company_refusals (
    company_id text NOT NULL,
    reason     text NOT NULL,
    refused    bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (company_id, reason)
);

-- +goose Down
DROP TABLE executor.company_refusals;
DROP TABLE executor.company_spend;
ALTER TABLE executor.runs DROP COLUMN spend_month;
