-- Schema v10: the HTTP server.
-- Which options a job was sent with explicitly (bits: 1 max_attempts, 2 timeout,
-- 4 backoff). Per-task-type settings fill in the others, at insert and again
-- when they change while the job waits; explicit ones are never overridden.
-- A constant default: adding the column rewrites no row.
ALTER TABLE conveyor_jobs ADD COLUMN explicit smallint NOT NULL DEFAULT 0;
-- Per-task-type settings (seed 001's t_schedule_cfg); NULL: not set, the
-- decorator's default applies.
CREATE TABLE conveyor_task_settings (
    task             text PRIMARY KEY,
    batch_size       integer,
    poll_interval_s  double precision,
    max_processing_s double precision,
    max_attempts     integer,
    retry_interval_s double precision,
    retry_cap_s      double precision,
    updated_at       timestamptz NOT NULL
);
-- API tokens: only a SHA-256 of the secret is stored; looked up by id.
CREATE TABLE conveyor_tokens (
    id          text PRIMARY KEY,
    name        text,
    scope       text NOT NULL CHECK (scope IN ('read', 'producer', 'worker', 'admin')),
    secret_hash text NOT NULL,
    created_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);
