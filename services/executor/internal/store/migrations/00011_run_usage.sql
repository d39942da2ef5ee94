-- +goose Up
-- A run's normalised token usage and its cost in US dollars (SPEC E1), kept
-- as columns of the run so that usage and spend can be summed per company,
-- session or agent in SQL. The run's own usage (its delta, not the provider
-- session's total) is what a run.terminal event reported, normalised when
-- the result is recorded; these columns own it (the stored result no longer
-- carries it). cost_usd is NULL when the provider reported no cost, or one
-- in another currency (never converted).
ALTER TABLE executor.runs
    ADD COLUMN usage_input_tokens        bigint CHECK (usage_input_tokens >= 0),
    ADD COLUMN usage_cached_input_tokens bigint CHECK (usage_cached_input_tokens >= 0),
    ADD COLUMN usage_output_tokens       bigint CHECK (usage_output_tokens >= 0),
    ADD COLUMN cost_usd                  numeric CHECK (cost_usd >= 0);

-- +goose Down
ALTER TABLE executor.runs
    DROP COLUMN cost_usd,
    DROP COLUMN usage_output_tokens,
    DROP COLUMN usage_cached_input_tokens,
    DROP COLUMN usage_input_tokens;
