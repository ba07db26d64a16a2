-- Schema v6 for SQLite: the same as PostgreSQL (JSON lists as TEXT).
ALTER TABLE conveyor_jobs ADD COLUMN pinned_to TEXT;
ALTER TABLE conveyor_jobs ADD COLUMN spread_group TEXT;
ALTER TABLE conveyor_workers ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
