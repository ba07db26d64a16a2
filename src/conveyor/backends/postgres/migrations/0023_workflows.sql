-- Schema v23: workflows. A workflow is a graph of nodes declared up front; each
-- node becomes a job when its parents have ended (the flow leader makes it, once:
-- an idempotency key per node and round). A map node becomes one job per item of
-- its parent's list result; those jobs are the map's item rows (item >= 0).
CREATE TABLE conveyor_workflows (
    id              bigserial   PRIMARY KEY,
    name            text        NOT NULL,
    state           text        NOT NULL CHECK (state IN
                        ('running', 'succeeded', 'failed', 'cancelled')),
    idempotency_key text,
    fingerprint     text,
    total           integer     NOT NULL,
    -- declared nodes not ended yet (open_nodes), and those that ended failed or
    -- cancelled (failures):
    -- the run ends when open_nodes reaches 0
    open_nodes      integer     NOT NULL,
    failures        integer     NOT NULL DEFAULT 0,
    round           integer     NOT NULL DEFAULT 0,
    error           text,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    finished_at     timestamptz,
    cancelled_at    timestamptz
);
CREATE UNIQUE INDEX conveyor_workflows_idempotency_key_idx ON conveyor_workflows (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX conveyor_workflows_state_idx ON conveyor_workflows (state, id);

CREATE TABLE conveyor_workflow_nodes (
    workflow_id       bigint      NOT NULL,
    node              integer     NOT NULL,
    -- -1: the declared node; 0..n-1: the items of a map node
    item              integer     NOT NULL,
    name              text        NOT NULL,
    kind              text        NOT NULL CHECK (kind IN ('task', 'map', 'item')),
    -- the task call (a step template with its args and kwargs); NULL on items
    step              jsonb,
    parents           jsonb       NOT NULL,
    children          jsonb       NOT NULL,
    over_node         integer,
    on_parent_failure text        NOT NULL,
    -- parents (or, for a started map, items) not ended yet
    waiting           integer     NOT NULL,
    state             text        NOT NULL CHECK (state IN
                        ('pending', 'running', 'succeeded', 'failed', 'cancelled', 'skipped')),
    job_id            bigint,
    items             integer,
    result            jsonb,
    error             text,
    round             integer     NOT NULL DEFAULT 0,
    updated_at        timestamptz NOT NULL,
    finished_at       timestamptz,
    PRIMARY KEY (workflow_id, node, item)
);
-- the flow leader finds a finished job's node by its job id
CREATE INDEX conveyor_workflow_nodes_job_idx ON conveyor_workflow_nodes (job_id)
    WHERE job_id IS NOT NULL;
