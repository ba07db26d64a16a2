-- Schema v14: finished jobs by state and finish time, for retention (see the
-- PostgreSQL migration): pruning no longer reads the whole table each pass.
CREATE INDEX conveyor_jobs_finished_idx ON conveyor_jobs (state, finished_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');
