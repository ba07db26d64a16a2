-- Schema v7 for SQLite: the same as PostgreSQL.
ALTER TABLE conveyor_queues ADD COLUMN rate_per_s REAL;
ALTER TABLE conveyor_queues ADD COLUMN rate_burst REAL;
