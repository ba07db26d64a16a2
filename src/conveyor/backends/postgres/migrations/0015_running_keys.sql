-- Schema v15: running jobs by concurrency key. A keyed claim counts the running
-- jobs of its candidates' keys (across queues); without this index it read every
-- running job of every queue through the owner index (all of a busy cluster's
-- running jobs per claim), and, as a bitmap scan, every dead entry left there by
-- jobs run since the last VACUUM (67,900 of them, 3.6 ms of an 11 ms claim). Only
-- keyed jobs enter it, and only while they run. (Building it reads the table once,
-- blocking writes meanwhile: seconds on 10M jobs.)
CREATE INDEX conveyor_jobs_running_key_idx ON conveyor_jobs (concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;
