-- Schema v6: placement. pinned_to: a JSON list of worker ids and tags, one of
-- which the claiming worker must have. spread_group: jobs of one group each run on
-- a different worker (a broadcast, a redundant check).
ALTER TABLE conveyor_jobs ADD COLUMN pinned_to jsonb;
ALTER TABLE conveyor_jobs ADD COLUMN spread_group text;
ALTER TABLE conveyor_workers ADD COLUMN tags text[] NOT NULL DEFAULT '{}';
