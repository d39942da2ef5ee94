-- +goose Up
-- Every runner instance that ever attached for a session scope (SPEC F9).
-- runs.runner_instance_id keeps only the newest attempt's runner, so a
-- runner that served an attempt cut off by a host death and was replaced
-- by a fresh one elsewhere would be forgotten; its root, found again on a
-- gateway the scope fails back to, would then look foreign (quarantined,
-- the run failed) instead of left behind by a move (set aside, the
-- checkpoint restored). Written in the same statement as the run's runner.
CREATE TABLE executor.scope_runners (
    session_scope      text NOT NULL,
    runner_instance_id text NOT NULL,
    first_run_id       text NOT NULL,
    last_submit_seq    bigint NOT NULL,
    PRIMARY KEY (session_scope, runner_instance_id)
);
INSERT INTO executor.scope_runners (session_scope, runner_instance_id, first_run_id, last_submit_seq)
SELECT DISTINCT ON (session_scope, runner_instance_id) session_scope, runner_instance_id, run_id,
       max(submit_seq) OVER (PARTITION BY session_scope, runner_instance_id)
  FROM executor.runs
 WHERE runner_instance_id IS NOT NULL
 ORDER BY session_scope, runner_instance_id, submit_seq;

-- +goose Down
DROP TABLE executor.scope_runners;
