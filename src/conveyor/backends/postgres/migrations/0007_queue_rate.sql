-- Schema v7: a rate limit for a whole queue (a token bucket keyed "queue=<name>").
ALTER TABLE conveyor_queues ADD COLUMN rate_per_s double precision;
ALTER TABLE conveyor_queues ADD COLUMN rate_burst double precision;
