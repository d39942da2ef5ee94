-- +goose Up
-- SPEC Q1–Q3: what one company may use of the fleet. One row per company
-- that has its own settings and one row '*' for every other company (the
-- same shape as retention_settings). A NULL limit is no limit.
--   max_running_runs   runs of the company in flight at once (Q1); a run over
--                      it stays queued and is claimed when a slot frees.
--   max_warm_sessions  sessions of the company kept warm at once (Q1).
--   max_queued_runs    runs of the company waiting to start (Q1); a submit
--                      over it is refused.
--   weight             the company's share of free slots against the other
--                      companies with due work (Q3), 1 by default.
--   monthly_budget_usd settled USD cost allowed per calendar month, UTC (Q2).
--   budget_warn_ratio  the fraction of the budget at which budget.warning is
--                      recorded once a month (Q2).
--   budget_policy      what runs in flight do at the hard limit (Q2).
CREATE TABLE executor.company_limits (
    company_id         text PRIMARY KEY,
    max_running_runs   integer CHECK (max_running_runs >= 0),
    max_warm_sessions  integer CHECK (max_warm_sessions >= 0),
    max_queued_runs    integer CHECK (max_queued_runs >= 0),
    weight             integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    monthly_budget_usd numeric(14, 6) CHECK (monthly_budget_usd >= 0),
    budget_warn_ratio  numeric(4, 3) NOT NULL DEFAULT 0.8 CHECK (budget_warn_ratio > 0 AND budget_warn_ratio <= 1),
    budget_policy      text NOT NULL DEFAULT 'finish_turn' CHECK (budget_policy IN ('finish_turn', 'cancel')),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    updated_by         text NOT NULL
);
INSERT INTO executor.company_limits (company_id, updated_by) VALUES ('*', 'migration 00030');

-- +goose Down
DROP TABLE executor.company_limits;
