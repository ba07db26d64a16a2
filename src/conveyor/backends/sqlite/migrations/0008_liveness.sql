-- Schema v8 (see the PostgreSQL migration): worker liveness, tenants, the task
-- names a worker serves, a batch's callback job.
ALTER TABLE conveyor_jobs ADD COLUMN tenant TEXT;
CREATE INDEX conveyor_jobs_tenant_idx ON conveyor_jobs (tenant, id) WHERE tenant IS NOT NULL;
CREATE INDEX conveyor_jobs_owner_idx ON conveyor_jobs (lease_owner) WHERE state = 'running';
CREATE INDEX conveyor_jobs_problem_idx ON conveyor_jobs (state, id)
    WHERE state IN ('failed', 'cancelled');
ALTER TABLE conveyor_workers ADD COLUMN tasks TEXT;
ALTER TABLE conveyor_batches ADD COLUMN callback_job_id INTEGER;
CREATE TABLE conveyor_periodics (
    name          TEXT PRIMARY KEY,
    first_seen_at REAL NOT NULL
);
