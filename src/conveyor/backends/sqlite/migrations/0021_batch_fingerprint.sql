-- Schema v21 (see the PostgreSQL migration): the hash of what a batch created
-- under an idempotency key was asked for.
ALTER TABLE conveyor_batches ADD COLUMN fingerprint TEXT;
