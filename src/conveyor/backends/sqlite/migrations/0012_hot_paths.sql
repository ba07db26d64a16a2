-- Schema v12 (see the PostgreSQL migration): cheaper claims and completions.
-- A job's lease deadline is set only for holders that do not heartbeat (remote
-- clients with lease_s); every other running job has none. Indexing only the
-- deadlines that exist keeps one index write off every claim.
DROP INDEX conveyor_jobs_lease_idx;
CREATE INDEX conveyor_jobs_lease_idx ON conveyor_jobs (lease_expires_at)
    WHERE state = 'running' AND lease_expires_at IS NOT NULL;
-- From v12 a succeeded attempt writes no conveyor_attempts row: the job row keeps
-- what it would have said (attempt, stage, started_at, finished_at, and the
-- worker, now kept in lease_owner), and the attempt list is read from both.
