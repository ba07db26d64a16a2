-- Schema v14: finished jobs by state and finish time, for retention (see the
-- PostgreSQL migration; no partial index here, so it holds every job).
CREATE INDEX conveyor_jobs_finished_idx ON conveyor_jobs (state, finished_at);
