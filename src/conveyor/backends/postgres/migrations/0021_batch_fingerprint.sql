-- Schema v21: what a batch created under an idempotency key was asked for, as a
-- hash ("sha256:" and 64 hex digits), so that the key names one request: a
-- repeat asking for the same batch gets it back, one asking for a different
-- batch is refused (POST /v1/batches: 422). Jobs keep theirs in their headers;
-- a batch row has none. NULL: created without a key, or before v21.
ALTER TABLE conveyor_batches ADD COLUMN fingerprint text;
