-- Conveyor schema v1 for SQLite. Same tables, columns and indexes as PostgreSQL;
-- timestamps are REAL seconds since the epoch (UTC), JSON is TEXT.
CREATE TABLE conveyor_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    queue            TEXT    NOT NULL,
    task             TEXT    NOT NULL,
    args             TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN
                         ('scheduled', 'available', 'running', 'succeeded', 'failed', 'cancelled')),
    priority         INTEGER NOT NULL DEFAULT 0,
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
    timeout_s        REAL,
    backoff          TEXT,
    stage            TEXT,
    unique_key       TEXT,
    idempotency_key  TEXT,
    result           TEXT,
    error            TEXT,
    lease_owner      TEXT,
    lease_token      TEXT,
    lease_expires_at REAL,
    created_at       REAL    NOT NULL,
    scheduled_at     REAL    NOT NULL,
    started_at       REAL,
    finished_at      REAL
);

CREATE INDEX conveyor_jobs_fetch_idx ON conveyor_jobs (queue, priority DESC, scheduled_at, id)
    WHERE state IN ('available', 'scheduled');

CREATE INDEX conveyor_jobs_lease_idx ON conveyor_jobs (lease_expires_at)
    WHERE state = 'running';

CREATE UNIQUE INDEX conveyor_jobs_unique_key_idx ON conveyor_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('scheduled', 'available', 'running');

CREATE UNIQUE INDEX conveyor_jobs_idempotency_key_idx ON conveyor_jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE INDEX conveyor_jobs_state_idx ON conveyor_jobs (state, queue);

CREATE TABLE conveyor_attempts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id      INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    worker_id   TEXT,
    started_at  REAL,
    finished_at REAL    NOT NULL,
    outcome     TEXT    NOT NULL,
    error       TEXT,
    traceback   TEXT
);
CREATE INDEX conveyor_attempts_job_idx ON conveyor_attempts (job_id, id);

CREATE TABLE conveyor_workers (
    id           TEXT    PRIMARY KEY,
    hostname     TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    queues       TEXT    NOT NULL,
    concurrency  INTEGER NOT NULL,
    started_at   REAL    NOT NULL,
    last_seen_at REAL    NOT NULL
);
