-- Schema v23 (see the PostgreSQL migration): workflows and their nodes.
CREATE TABLE conveyor_workflows (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    name            TEXT    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN
                        ('running', 'succeeded', 'failed', 'cancelled')),
    idempotency_key TEXT,
    fingerprint     TEXT,
    total           INTEGER NOT NULL,
    open_nodes      INTEGER NOT NULL,
    failures        INTEGER NOT NULL DEFAULT 0,
    round           INTEGER NOT NULL DEFAULT 0,
    error           TEXT,
    created_at      REAL    NOT NULL,
    updated_at      REAL    NOT NULL,
    finished_at     REAL,
    cancelled_at    REAL
);
CREATE UNIQUE INDEX conveyor_workflows_idempotency_key_idx ON conveyor_workflows (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX conveyor_workflows_state_idx ON conveyor_workflows (state, id);

CREATE TABLE conveyor_workflow_nodes (
    workflow_id       INTEGER NOT NULL,
    node              INTEGER NOT NULL,
    item              INTEGER NOT NULL,
    name              TEXT    NOT NULL,
    kind              TEXT    NOT NULL CHECK (kind IN ('task', 'map', 'item')),
    step              TEXT,
    parents           TEXT    NOT NULL,
    children          TEXT    NOT NULL,
    over_node         INTEGER,
    on_parent_failure TEXT    NOT NULL,
    waiting           INTEGER NOT NULL,
    state             TEXT    NOT NULL CHECK (state IN
                        ('pending', 'running', 'succeeded', 'failed', 'cancelled', 'skipped')),
    job_id            INTEGER,
    items             INTEGER,
    result            TEXT,
    error             TEXT,
    round             INTEGER NOT NULL DEFAULT 0,
    updated_at        REAL    NOT NULL,
    finished_at       REAL,
    PRIMARY KEY (workflow_id, node, item)
) WITHOUT ROWID;
CREATE INDEX conveyor_workflow_nodes_job_idx ON conveyor_workflow_nodes (job_id)
    WHERE job_id IS NOT NULL;
