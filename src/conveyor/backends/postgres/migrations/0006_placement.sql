-- Schema v6: placement. pinned_to: a JSON list of worker ids and tags, one of
-- which the claiming worker must have. spread_group: jobs of one group each run on
-- a different worker (a broadcast, a redundant check).
ALTER TABLE conveyor_jobs ADD COLUMN pinned_to jsonb;
ALTER TABLE conveyor_jobs ADD COLUMN spread_group text;
ALTER TABLE conveyor_workers ADD COLUMN tags text[] NOT NULL DEFAULT '{}';
-- The distinct-workers check looks up the other jobs of a group.
CREATE INDEX conveyor_jobs_spread_idx ON conveyor_jobs (spread_group) WHERE spread_group IS NOT NULL;
