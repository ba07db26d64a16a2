-- Schema v8: a running job is its worker's for as long as the worker heartbeats
-- (one row per worker), so leases are no longer renewed job by job;
-- lease_expires_at is now only a deadline for jobs held without heartbeats.
-- Also: tenants, the task names a worker serves, a batch's callback job.
ALTER TABLE conveyor_jobs ADD COLUMN tenant text;
CREATE INDEX conveyor_jobs_tenant_idx ON conveyor_jobs (tenant, id) WHERE tenant IS NOT NULL;
-- The heartbeat reads, and the rescuer judges, running jobs by their worker.
CREATE INDEX conveyor_jobs_owner_idx ON conveyor_jobs (lease_owner) WHERE state = 'running';
-- Lists of failed and cancelled jobs (what operators look for), newest first,
-- without walking every succeeded job; succeeded jobs stay out of this index.
CREATE INDEX conveyor_jobs_problem_idx ON conveyor_jobs (state, id)
    WHERE state IN ('failed', 'cancelled');
-- NULL: the worker runs any task (resolves handlers by import path).
ALTER TABLE conveyor_workers ADD COLUMN tasks jsonb;
ALTER TABLE conveyor_batches ADD COLUMN callback_job_id bigint;
-- When each periodic schedule was first seen: ticks from before are never run.
CREATE TABLE conveyor_periodics (
    name          text        PRIMARY KEY,
    first_seen_at timestamptz NOT NULL
);
