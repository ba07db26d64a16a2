-- Schema v9: a change stamp on jobs and batches, for event streams that resume.
-- Every statement that changes a job's state (or a batch's) writes the id of its
-- transaction here, in the same statement: no second table written per job.
-- A reader takes rows in (changed, id) order up to the oldest transaction still
-- running, so a late commit is never skipped.
ALTER TABLE conveyor_jobs ADD COLUMN changed xid8;
CREATE INDEX conveyor_jobs_changed_idx ON conveyor_jobs (changed, id) WHERE changed IS NOT NULL;
ALTER TABLE conveyor_batches ADD COLUMN changed xid8;
CREATE INDEX conveyor_batches_changed_idx ON conveyor_batches (changed, id)
    WHERE changed IS NOT NULL;
