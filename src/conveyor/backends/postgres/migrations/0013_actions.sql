-- Schema v13: bulk actions run in the background, and their record (who asked
-- for what, on which jobs, how far it got): the dashboard's audit log.
CREATE TABLE conveyor_actions (
    id          text        PRIMARY KEY,
    action      text        NOT NULL,
    filter      text        NOT NULL,
    actor       text,
    matched     integer     NOT NULL,
    done        integer     NOT NULL DEFAULT 0,
    requested   integer     NOT NULL DEFAULT 0,
    state       text        NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    error       text,
    created_at  timestamptz NOT NULL,
    finished_at timestamptz
);
CREATE INDEX conveyor_actions_created_idx ON conveyor_actions (created_at);
