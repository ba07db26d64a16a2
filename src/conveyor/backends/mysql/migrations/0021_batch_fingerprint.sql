-- Schema v21 (see the PostgreSQL migration): the hash of what a batch created
-- under an idempotency key was asked for ("sha256:" and 64 hex digits).
ALTER TABLE conveyor_batches ADD COLUMN fingerprint varchar(80);
