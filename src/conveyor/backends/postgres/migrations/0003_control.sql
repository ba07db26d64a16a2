-- Schema v3: queue control (pause), cancelling running jobs, remote stop,
-- priority aging (priority is the effective, aged value; base_priority the one
-- sent, filled in the first time the job ages).
CREATE TABLE conveyor_queues (
    name       text        PRIMARY KEY,
    paused     boolean     NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL
);
ALTER TABLE conveyor_jobs ADD COLUMN base_priority integer;
ALTER TABLE conveyor_jobs ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
ALTER TABLE conveyor_workers ADD COLUMN stop_requested boolean NOT NULL DEFAULT false;
