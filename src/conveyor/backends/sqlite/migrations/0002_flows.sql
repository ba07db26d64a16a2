-- Schema v2 for SQLite: the same tables, columns and indexes as PostgreSQL.
CREATE TABLE conveyor_batches (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    name            TEXT,
    task            TEXT    NOT NULL,
    total           INTEGER NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN
                        ('running', 'succeeded', 'completed_with_failures', 'cancelled')),
    idempotency_key TEXT,
    on_complete     TEXT,
    closings        INTEGER NOT NULL DEFAULT 0,
    counts          TEXT,
    created_at      REAL    NOT NULL,
    finished_at     REAL,
    cancelled_at    REAL
);
CREATE UNIQUE INDEX conveyor_batches_idempotency_key_idx ON conveyor_batches (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX conveyor_batches_open_idx ON conveyor_batches (id) WHERE state = 'running';

ALTER TABLE conveyor_jobs ADD COLUMN batch_id INTEGER;
ALTER TABLE conveyor_jobs ADD COLUMN context TEXT;
ALTER TABLE conveyor_jobs ADD COLUMN chain TEXT;
ALTER TABLE conveyor_jobs ADD COLUMN chain_root INTEGER;
ALTER TABLE conveyor_jobs ADD COLUMN chain_next INTEGER;

CREATE INDEX conveyor_jobs_batch_idx ON conveyor_jobs (batch_id, state) WHERE batch_id IS NOT NULL;

CREATE INDEX conveyor_jobs_chain_due_idx ON conveyor_jobs (id)
    WHERE chain IS NOT NULL AND chain_next IS NULL AND state IN ('succeeded', 'failed', 'cancelled');

ALTER TABLE conveyor_attempts ADD COLUMN stage TEXT;

CREATE TABLE conveyor_leaders (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    expires_at REAL NOT NULL
);
