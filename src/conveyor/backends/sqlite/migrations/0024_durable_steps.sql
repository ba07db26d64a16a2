-- Schema v24 (see the PostgreSQL migration): durable steps inside one job, and
-- the events they wait for. Times are epoch seconds, as everywhere here.
CREATE TABLE conveyor_job_steps (
    job_id     INTEGER NOT NULL,
    name       TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    result     TEXT,
    done       INTEGER NOT NULL DEFAULT 0,
    timed_out  INTEGER NOT NULL DEFAULT 0,
    wake_at    REAL,
    event_key  TEXT,
    created_at REAL    NOT NULL,
    PRIMARY KEY (job_id, name)
);
CREATE INDEX conveyor_job_steps_waiting_idx ON conveyor_job_steps (event_key)
    WHERE kind = 'wait' AND NOT done;

CREATE TABLE conveyor_events (
    event_key  TEXT NOT NULL PRIMARY KEY,
    payload    TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX conveyor_events_created_idx ON conveyor_events (created_at);
