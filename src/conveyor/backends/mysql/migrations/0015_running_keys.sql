-- Schema v15: running jobs by concurrency key (PostgreSQL: a partial index). The
-- key while the job runs, else NULL: a keyed claim's count of its candidates'
-- running keys reads one index range per key instead of every running job, and
-- an unkeyed job never rewrites this index (NULL stays NULL). VIRTUAL: adding it
-- does not rebuild the table; the index holds the values.
ALTER TABLE conveyor_jobs
    ADD COLUMN running_key varchar(255) AS (CASE WHEN state = 'running'
                                             THEN concurrency_key END) VIRTUAL;
CREATE INDEX conveyor_jobs_running_key_idx ON conveyor_jobs (running_key);
