-- Schema v3 for SQLite: the same as PostgreSQL (booleans are 0/1).
CREATE TABLE conveyor_queues (
    name       TEXT    PRIMARY KEY,
    paused     INTEGER NOT NULL DEFAULT 0,
    updated_at REAL    NOT NULL
);
ALTER TABLE conveyor_jobs ADD COLUMN base_priority INTEGER;
ALTER TABLE conveyor_jobs ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conveyor_workers ADD COLUMN stop_requested INTEGER NOT NULL DEFAULT 0;
