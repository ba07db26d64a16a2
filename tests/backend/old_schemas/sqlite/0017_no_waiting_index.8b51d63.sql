-- Schema v17 (see the PostgreSQL migration): the oldest-waiting probe reads the
-- fetch index; the waiting index only cost every enqueue an entry.
DROP INDEX IF EXISTS conveyor_jobs_waiting_idx;
