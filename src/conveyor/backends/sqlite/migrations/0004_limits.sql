-- Schema v4 for SQLite: the same as PostgreSQL.
ALTER TABLE conveyor_queues ADD COLUMN max_running INTEGER;
ALTER TABLE conveyor_queues ADD COLUMN keyed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conveyor_jobs ADD COLUMN concurrency_key TEXT;
ALTER TABLE conveyor_jobs ADD COLUMN concurrency_limit INTEGER;
