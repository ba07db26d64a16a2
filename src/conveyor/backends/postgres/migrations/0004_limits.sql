-- Schema v4: cluster-wide concurrency limits, per queue and per key.
ALTER TABLE conveyor_queues ADD COLUMN max_running integer;
-- Set when a job with a concurrency key enters the queue: claims from it then go
-- through the serialized, limit-aware path.
ALTER TABLE conveyor_queues ADD COLUMN keyed boolean NOT NULL DEFAULT false;
ALTER TABLE conveyor_jobs ADD COLUMN concurrency_key text;
ALTER TABLE conveyor_jobs ADD COLUMN concurrency_limit integer;
