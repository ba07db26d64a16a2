-- Schema v23 (see the PostgreSQL migration): workflows and their nodes.
CREATE TABLE conveyor_workflows (
    id              bigint       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name            varchar(255) NOT NULL,
    state           varchar(32)  NOT NULL CHECK (state IN
                        ('running', 'succeeded', 'failed', 'cancelled')),
    idempotency_key varchar(512),
    fingerprint     varchar(80),
    total           integer      NOT NULL,
    open_nodes      integer      NOT NULL,
    failures        integer      NOT NULL DEFAULT 0,
    round           integer      NOT NULL DEFAULT 0,
    error           text,
    created_at      datetime(6)  NOT NULL,
    updated_at      datetime(6)  NOT NULL,
    finished_at     datetime(6),
    cancelled_at    datetime(6),
    UNIQUE KEY conveyor_workflows_idempotency_key_idx (idempotency_key),
    KEY conveyor_workflows_state_idx (state, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE conveyor_workflow_nodes (
    workflow_id       bigint       NOT NULL,
    node              integer      NOT NULL,
    item              integer      NOT NULL,
    name              varchar(255) NOT NULL,
    kind              varchar(16)  NOT NULL CHECK (kind IN ('task', 'map', 'item')),
    step              json,
    parents           json         NOT NULL,
    children          json         NOT NULL,
    over_node         integer,
    on_parent_failure varchar(16)  NOT NULL,
    waiting           integer      NOT NULL,
    state             varchar(32)  NOT NULL CHECK (state IN
                        ('pending', 'running', 'succeeded', 'failed', 'cancelled', 'skipped')),
    job_id            bigint,
    items             integer,
    result            json,
    error             text,
    round             integer      NOT NULL DEFAULT 0,
    updated_at        datetime(6)  NOT NULL,
    finished_at       datetime(6),
    PRIMARY KEY (workflow_id, node, item),
    KEY conveyor_workflow_nodes_job_idx (job_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
