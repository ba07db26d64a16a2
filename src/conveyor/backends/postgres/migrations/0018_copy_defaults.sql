-- Schema v18: a bulk enqueue by COPY whose jobs start now leaves created_at,
-- scheduled_at and the change stamp to these defaults (the same values: now() is
-- the transaction's start, as job_copy_begin reads it), instead of sending them
-- as text the server parses on every row: two timestamps and an xid8 per row were
-- 17 of 48 ms of a 20,000-row COPY into an unindexed copy of the table (the
-- whole COPY: about 170 ms). Every other insert names these columns.
ALTER TABLE conveyor_jobs
    ALTER COLUMN created_at SET DEFAULT now(),
    ALTER COLUMN scheduled_at SET DEFAULT now(),
    ALTER COLUMN changed SET DEFAULT pg_current_xact_id();
