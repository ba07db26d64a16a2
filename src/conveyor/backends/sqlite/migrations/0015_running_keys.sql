-- Schema v15: running jobs by concurrency key, for a keyed claim's count of its
-- candidates' running keys (see the PostgreSQL migration).
CREATE INDEX conveyor_jobs_running_key_idx ON conveyor_jobs (concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;
