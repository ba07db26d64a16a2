-- Schema v19: repair databases created by an earlier text of a migration that was
-- edited after its release. Those recorded their version without the change, and
-- no later migration makes up for it:
--   0001 (282e4e2)  an index on (state, queue) that 4be1824 removed: every write
--                   kept it up, and the planner could take it for a claim
--   0006 (cae1425)  no spread index (771f6e3 added it)
--   0011 (00570bf)  the waiting index over both waiting states, which a claim
--                   took and then sorted every waiting job; no due index
--   0011 (fb9c677)  the waiting index without id (df35e08 added it)
--   0017 (8b51d63)  the waiting index dropped (506bbbd reverted that v17)
-- SQLite cannot test an index's definition in SQL, so the waiting index is built
-- again whatever it was (one pass over the job table, once); the others only where
-- missing or extra. On the real schema the result is the same schema.
DROP INDEX IF EXISTS conveyor_jobs_state_idx;
CREATE INDEX IF NOT EXISTS conveyor_jobs_spread_idx ON conveyor_jobs (spread_group)
    WHERE spread_group IS NOT NULL;
DROP INDEX IF EXISTS conveyor_jobs_waiting_idx;
CREATE INDEX conveyor_jobs_waiting_idx ON conveyor_jobs (queue, scheduled_at, id)
    WHERE state = 'available';
CREATE INDEX IF NOT EXISTS conveyor_jobs_due_idx ON conveyor_jobs (scheduled_at)
    WHERE state = 'scheduled';
