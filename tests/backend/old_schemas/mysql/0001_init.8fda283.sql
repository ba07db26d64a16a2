-- MySQL / MariaDB: the whole v13 schema at once (the other dialects reached it in
-- 13 steps; 0002..0013 are empty here so that version numbers stay the same on
-- every dialect and v14 is an ordinary file). InnoDB (row locks, SKIP LOCKED),
-- utf8mb4 with a binary collation: keys, queue and task names compare exactly as
-- on PostgreSQL and SQLite ('A' <> 'a'). Timestamps are UTC DATETIME(6) (the
-- session time zone is '+00:00'); JSON columns are JSON.
-- Differences from the PostgreSQL schema, each marked below: no partial indexes
-- (plain indexes, or a generated column holding the value only when the
-- PostgreSQL predicate holds), no arrays (JSON), `key` is a reserved word.

CREATE TABLE conveyor_jobs (
    id                bigint           NOT NULL AUTO_INCREMENT PRIMARY KEY,
    queue             varchar(255)     NOT NULL,
    task              varchar(255)     NOT NULL,
    args              json             NOT NULL,
    state             varchar(16)      NOT NULL CHECK (state IN
                          ('scheduled', 'available', 'running', 'succeeded', 'failed', 'cancelled')),
    priority          integer          NOT NULL DEFAULT 0,
    attempt           integer          NOT NULL DEFAULT 0,
    max_attempts      integer          NOT NULL CHECK (max_attempts >= 1),
    timeout_s         double,
    backoff           json,
    stage             varchar(255),
    unique_key        varchar(512),
    idempotency_key   varchar(512),
    result            json,
    error             mediumtext,
    lease_owner       varchar(255),
    lease_token       varchar(64),
    lease_expires_at  datetime(6),
    created_at        datetime(6)      NOT NULL,
    scheduled_at      datetime(6)      NOT NULL,
    started_at        datetime(6),
    finished_at       datetime(6),
    batch_id          bigint,
    context           json,
    chain             json,
    chain_root        bigint,
    chain_next        bigint,
    base_priority     integer,
    cancel_requested  boolean          NOT NULL DEFAULT FALSE,
    concurrency_key   varchar(255),
    concurrency_limit integer,
    rate_key          varchar(255),
    rate_per_s        double,
    rate_burst        double,
    pinned_to         json,
    spread_group      varchar(255),
    tenant            varchar(255),
    -- change stamp (see the CHANGE macro in mysql/backend.py): microseconds since
    -- the epoch of the writing statement, not a transaction id
    changed           bigint,
    explicit          smallint         NOT NULL DEFAULT 0,
    -- no partial unique index: this generated column holds the unique key only
    -- while the job is unfinished (NULLs never conflict), which is what the
    -- PostgreSQL index "(unique_key) WHERE state IN (...)" enforces
    unique_key_active varchar(512) AS (CASE WHEN state IN ('scheduled', 'available', 'running')
                                            THEN unique_key END) STORED,
    UNIQUE KEY conveyor_jobs_unique_key_idx (unique_key_active),
    UNIQUE KEY conveyor_jobs_idempotency_key_idx (idempotency_key),
    -- the fetch index, not partial: finished jobs are in it too, after the
    -- claimable ones of each (queue, state)
    KEY conveyor_jobs_fetch_idx (queue, state, priority DESC, scheduled_at, id),
    KEY conveyor_jobs_lease_idx (state, lease_expires_at),
    KEY conveyor_jobs_batch_idx (batch_id, state),
    KEY conveyor_jobs_chain_due_idx (chain_next, state, id),
    KEY conveyor_jobs_spread_idx (spread_group),
    KEY conveyor_jobs_tenant_idx (tenant, id),
    KEY conveyor_jobs_owner_idx (lease_owner, state),
    KEY conveyor_jobs_problem_idx (state, id),
    KEY conveyor_jobs_changed_idx (changed, id),
    KEY conveyor_jobs_waiting_idx (queue, state, scheduled_at, id),
    KEY conveyor_jobs_due_idx (state, scheduled_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE conveyor_attempts (
    id          bigint       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    job_id      bigint       NOT NULL,
    attempt     integer      NOT NULL,
    worker_id   varchar(255),
    started_at  datetime(6),
    finished_at datetime(6)  NOT NULL,
    outcome     varchar(32)  NOT NULL,
    error       mediumtext,
    traceback   mediumtext,
    stage       varchar(255),
    KEY conveyor_attempts_job_idx (job_id, id),
    KEY conveyor_attempts_worker_idx (worker_id, job_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE conveyor_workers (
    id             varchar(255) NOT NULL PRIMARY KEY,
    hostname       varchar(255) NOT NULL,
    pid            integer      NOT NULL,
    -- JSON lists where PostgreSQL has text[]
    queues         json         NOT NULL,
    concurrency    integer      NOT NULL,
    started_at     datetime(6)  NOT NULL,
    last_seen_at   datetime(6)  NOT NULL,
    stop_requested boolean      NOT NULL DEFAULT FALSE,
    tags           json         NOT NULL,
    tasks          json
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE conveyor_batches (
    id              bigint       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name            varchar(255),
    task            varchar(255) NOT NULL,
    total           integer      NOT NULL,
    state           varchar(32)  NOT NULL CHECK (state IN
                        ('running', 'succeeded', 'completed_with_failures', 'cancelled')),
    idempotency_key varchar(512),
    on_complete     json,
    closings        integer      NOT NULL DEFAULT 0,
    counts          json,
    created_at      datetime(6)  NOT NULL,
    finished_at     datetime(6),
    cancelled_at    datetime(6),
    callback_job_id bigint,
    changed         bigint,
    UNIQUE KEY conveyor_batches_idempotency_key_idx (idempotency_key),
    KEY conveyor_batches_open_idx (state, id),
    KEY conveyor_batches_changed_idx (changed, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE conveyor_leaders (
    name       varchar(255) NOT NULL PRIMARY KEY,
    holder     varchar(255) NOT NULL,
    expires_at datetime(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE conveyor_queues (
    name        varchar(255) NOT NULL PRIMARY KEY,
    paused      boolean      NOT NULL DEFAULT FALSE,
    updated_at  datetime(6)  NOT NULL,
    max_running integer,
    keyed       boolean      NOT NULL DEFAULT FALSE,
    rate_per_s  double,
    rate_burst  double
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- `key` is a reserved word in MySQL: quoted wherever it is used
CREATE TABLE conveyor_rate_limits (
    `key`      varchar(512) NOT NULL PRIMARY KEY,
    tokens     double       NOT NULL,
    updated_at datetime(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE conveyor_periodics (
    name          varchar(255) NOT NULL PRIMARY KEY,
    first_seen_at datetime(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE conveyor_task_settings (
    task             varchar(255) NOT NULL PRIMARY KEY,
    batch_size       integer,
    poll_interval_s  double,
    max_processing_s double,
    max_attempts     integer,
    retry_interval_s double,
    retry_cap_s      double,
    updated_at       datetime(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE conveyor_tokens (
    id          varchar(255) NOT NULL PRIMARY KEY,
    name        varchar(255),
    scope       varchar(16)  NOT NULL CHECK (scope IN ('read', 'producer', 'worker', 'admin')),
    secret_hash varchar(255) NOT NULL,
    created_at  datetime(6)  NOT NULL,
    revoked_at  datetime(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Counts (see the PostgreSQL migration 11). MySQL has no statement-level
-- triggers with transition tables: row triggers append one delta row per change
-- (insert-only, so concurrent writers never wait on a shared counter row); the
-- leader folds them into conveyor_counts. The deltas have an id so a fold deletes
-- exactly the rows it read (see counts_fold in mysql/backend.py).
CREATE TABLE conveyor_counts (
    queue varchar(255) NOT NULL,
    task  varchar(255) NOT NULL,
    state varchar(16)  NOT NULL,
    n     bigint       NOT NULL,
    PRIMARY KEY (queue, task, state)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE conveyor_count_deltas (
    id    bigint       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    queue varchar(255) NOT NULL,
    task  varchar(255) NOT NULL,
    state varchar(16)  NOT NULL,
    n     bigint       NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TRIGGER conveyor_count_insert AFTER INSERT ON conveyor_jobs FOR EACH ROW
BEGIN
    INSERT INTO conveyor_count_deltas (queue, task, state, n)
    VALUES (NEW.queue, NEW.task, NEW.state, 1);
END;
CREATE TRIGGER conveyor_count_update AFTER UPDATE ON conveyor_jobs FOR EACH ROW
BEGIN
    IF NOT (OLD.state <=> NEW.state AND OLD.queue <=> NEW.queue AND OLD.task <=> NEW.task) THEN
        INSERT INTO conveyor_count_deltas (queue, task, state, n)
        VALUES (OLD.queue, OLD.task, OLD.state, -1), (NEW.queue, NEW.task, NEW.state, 1);
    END IF;
END;
CREATE TRIGGER conveyor_count_delete AFTER DELETE ON conveyor_jobs FOR EACH ROW
BEGIN
    INSERT INTO conveyor_count_deltas (queue, task, state, n)
    VALUES (OLD.queue, OLD.task, OLD.state, -1);
END;

CREATE TABLE conveyor_actions (
    id          varchar(64)  NOT NULL PRIMARY KEY,
    action      varchar(32)  NOT NULL,
    filter      mediumtext   NOT NULL,
    actor       varchar(255),
    matched     integer      NOT NULL,
    done        integer      NOT NULL DEFAULT 0,
    requested   integer      NOT NULL DEFAULT 0,
    state       varchar(16)  NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    error       mediumtext,
    created_at  datetime(6)  NOT NULL,
    finished_at datetime(6),
    KEY conveyor_actions_created_idx (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Row locks that stand in for PostgreSQL's transaction-scoped advisory locks:
-- limited claims of keyed queues serialise on the 'keys' row (a queue's own
-- claims lock its conveyor_queues row).
CREATE TABLE conveyor_locks (
    name varchar(64) NOT NULL PRIMARY KEY
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
INSERT INTO conveyor_locks (name) VALUES ('keys');
