-- Schema v13 (see the PostgreSQL migration): bulk actions and their audit record.
CREATE TABLE conveyor_actions (
    id          TEXT    PRIMARY KEY,
    action      TEXT    NOT NULL,
    filter      TEXT    NOT NULL,
    actor       TEXT,
    matched     INTEGER NOT NULL,
    done        INTEGER NOT NULL DEFAULT 0,
    requested   INTEGER NOT NULL DEFAULT 0,
    state       TEXT    NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    error       TEXT,
    created_at  REAL    NOT NULL,
    finished_at REAL
);
CREATE INDEX conveyor_actions_created_idx ON conveyor_actions (created_at);
