-- Schema v10 (see the PostgreSQL migration): explicit send options, per-task-type
-- settings, API tokens.
ALTER TABLE conveyor_jobs ADD COLUMN explicit INTEGER NOT NULL DEFAULT 0;
CREATE TABLE conveyor_task_settings (
    task             TEXT PRIMARY KEY,
    batch_size       INTEGER,
    poll_interval_s  REAL,
    max_processing_s REAL,
    max_attempts     INTEGER,
    retry_interval_s REAL,
    retry_cap_s      REAL,
    updated_at       REAL NOT NULL
);
CREATE TABLE conveyor_tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT,
    scope       TEXT NOT NULL CHECK (scope IN ('read', 'producer', 'worker', 'admin')),
    secret_hash TEXT NOT NULL,
    created_at  REAL NOT NULL,
    revoked_at  REAL
);
