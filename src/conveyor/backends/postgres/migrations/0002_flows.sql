-- Schema v2: batches (scatter + aggregate), multi-stage jobs, chains, leadership.

-- A batch row is written at creation and when the aggregator closes it; workers
-- never touch it. Progress is a GROUP BY over its jobs, never counters here.
CREATE TABLE conveyor_batches (
    id              bigserial   PRIMARY KEY,
    name            text,
    task            text        NOT NULL,
    total           integer     NOT NULL,
    state           text        NOT NULL CHECK (state IN
                        ('running', 'succeeded', 'completed_with_failures', 'cancelled')),
    idempotency_key text,
    on_complete     jsonb,
    closings        integer     NOT NULL DEFAULT 0,
    counts          jsonb,
    created_at      timestamptz NOT NULL,
    finished_at     timestamptz,
    cancelled_at    timestamptz
);
CREATE UNIQUE INDEX conveyor_batches_idempotency_key_idx ON conveyor_batches (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX conveyor_batches_open_idx ON conveyor_batches (id) WHERE state = 'running';

ALTER TABLE conveyor_jobs ADD COLUMN batch_id bigint;
ALTER TABLE conveyor_jobs ADD COLUMN context jsonb;
ALTER TABLE conveyor_jobs ADD COLUMN chain jsonb;
ALTER TABLE conveyor_jobs ADD COLUMN chain_root bigint;
ALTER TABLE conveyor_jobs ADD COLUMN chain_next bigint;

-- Progress and the aggregator's "anything still pending?" both read this index.
CREATE INDEX conveyor_jobs_batch_idx ON conveyor_jobs (batch_id, state) WHERE batch_id IS NOT NULL;

-- Finished jobs whose chain has not been advanced yet: what the flow service scans.
CREATE INDEX conveyor_jobs_chain_due_idx ON conveyor_jobs (id)
    WHERE chain IS NOT NULL AND chain_next IS NULL AND state IN ('succeeded', 'failed', 'cancelled');

ALTER TABLE conveyor_attempts ADD COLUMN stage text;

-- Single-holder services (the aggregator): a lease in the database, taken over
-- by another process when its holder stops renewing it.
CREATE TABLE conveyor_leaders (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);
