-- Schema v5 for SQLite: the same as PostgreSQL.
CREATE TABLE conveyor_rate_limits (
    key        TEXT PRIMARY KEY,
    tokens     REAL NOT NULL,
    updated_at REAL NOT NULL
);
ALTER TABLE conveyor_jobs ADD COLUMN rate_key TEXT;
ALTER TABLE conveyor_jobs ADD COLUMN rate_per_s REAL;
ALTER TABLE conveyor_jobs ADD COLUMN rate_burst REAL;
