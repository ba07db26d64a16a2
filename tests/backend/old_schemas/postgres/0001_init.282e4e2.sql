-- Conveyor schema v1: jobs, their attempts, live workers.
CREATE TABLE conveyor_jobs (
    id               bigserial PRIMARY KEY,
    queue            text             NOT NULL,
    task             text             NOT NULL,
    args             jsonb            NOT NULL,
    state            text             NOT NULL CHECK (state IN
                         ('scheduled', 'available', 'running', 'succeeded', 'failed', 'cancelled')),
    priority         integer          NOT NULL DEFAULT 0,
    attempt          integer          NOT NULL DEFAULT 0,
    max_attempts     integer          NOT NULL CHECK (max_attempts >= 1),
    timeout_s        double precision,
    backoff          jsonb,
    stage            text,
    unique_key       text,
    idempotency_key  text,
    result           jsonb,
    error            text,
    lease_owner      text,
    lease_token      text,
    lease_expires_at timestamptz,
    created_at       timestamptz      NOT NULL,
    scheduled_at     timestamptz      NOT NULL,
    started_at       timestamptz,
    finished_at      timestamptz
);

-- The claim query walks this index in order and stops after LIMIT rows; it only
-- holds jobs that can be claimed, so it stays small however many have finished.
CREATE INDEX conveyor_jobs_fetch_idx ON conveyor_jobs (queue, priority DESC, scheduled_at, id)
    WHERE state IN ('available', 'scheduled');

-- The rescuer looks for expired leases among running jobs only.
CREATE INDEX conveyor_jobs_lease_idx ON conveyor_jobs (lease_expires_at)
    WHERE state = 'running';

-- unique_key: one unfinished job per key. Enforced here, never by read-then-write.
CREATE UNIQUE INDEX conveyor_jobs_unique_key_idx ON conveyor_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('scheduled', 'available', 'running');

-- idempotency_key: one job per key, forever.
CREATE UNIQUE INDEX conveyor_jobs_idempotency_key_idx ON conveyor_jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE INDEX conveyor_jobs_state_idx ON conveyor_jobs (state, queue);

-- One row per ended attempt. No foreign key: checking it on every completion
-- costs drain throughput, and pruning deletes attempts with their job.
CREATE TABLE conveyor_attempts (
    id          bigserial   PRIMARY KEY,
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    worker_id   text,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL,
    outcome     text        NOT NULL,
    error       text,
    traceback   text
);
CREATE INDEX conveyor_attempts_job_idx ON conveyor_attempts (job_id, id);

CREATE TABLE conveyor_workers (
    id           text        PRIMARY KEY,
    hostname     text        NOT NULL,
    pid          integer     NOT NULL,
    queues       text[]      NOT NULL,
    concurrency  integer     NOT NULL,
    started_at   timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL
);
