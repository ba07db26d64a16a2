-- Schema v9 (see the PostgreSQL migration): change stamps for event streams. With
-- one writer at a time, a counter (one more than the largest stamp) is commit order.
ALTER TABLE conveyor_jobs ADD COLUMN changed INTEGER;
CREATE INDEX conveyor_jobs_changed_idx ON conveyor_jobs (changed, id) WHERE changed IS NOT NULL;
ALTER TABLE conveyor_batches ADD COLUMN changed INTEGER;
CREATE INDEX conveyor_batches_changed_idx ON conveyor_batches (changed, id)
    WHERE changed IS NOT NULL;
