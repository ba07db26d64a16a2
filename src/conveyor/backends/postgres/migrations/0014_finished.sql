-- Schema v14: finished jobs by state and finish time, for retention. Pruning asks
-- for the oldest jobs of one state finished before a cutoff; without this index
-- it read the whole table every pass of the leader (once a minute by default),
-- even when nothing was old enough (60 ms on 240,000 jobs, seconds on 10M).
-- (On a big table this index takes a while to build, blocking writes meanwhile.)
CREATE INDEX conveyor_jobs_finished_idx ON conveyor_jobs (state, finished_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');
