-- Schema v14: indexes that stop two reads from scanning the job table.
--
-- Finished jobs by state and finish time, for retention. Pruning asks
-- for the oldest jobs of one state finished before a cutoff; without this index
-- it read the whole table every pass of the leader (once a minute by default),
-- even when nothing was old enough (60 ms on 240,000 jobs, seconds on 10M).
-- (On a big table this index takes a while to build, blocking writes meanwhile.)
CREATE INDEX conveyor_jobs_finished_idx ON conveyor_jobs (state, finished_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');

-- Scheduled jobs per queue by due time: the oldest-waiting probe (/metrics, the
-- dashboard) asks each queue for its due scheduled jobs. With only the due index
-- (no queue column), the planner, after a bulk change and before ANALYZE, read the
-- fetch index instead, through every waiting job of the queue (111 ms a scrape on
-- 1,000,000 jobs); this index is as small as the scheduled jobs are few (0.5 ms).
CREATE INDEX conveyor_jobs_due_queue_idx ON conveyor_jobs (queue, scheduled_at)
    WHERE state = 'scheduled';
