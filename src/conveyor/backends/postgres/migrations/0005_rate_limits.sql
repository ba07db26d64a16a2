-- Schema v5: rate limits. A token bucket per key, shared by every worker through
-- this table; refilled lazily by the claim that reads it (no timer anywhere).
CREATE TABLE conveyor_rate_limits (
    key        text             PRIMARY KEY,
    tokens     double precision NOT NULL,
    updated_at timestamptz      NOT NULL
);
ALTER TABLE conveyor_jobs ADD COLUMN rate_key text;
ALTER TABLE conveyor_jobs ADD COLUMN rate_per_s double precision;
ALTER TABLE conveyor_jobs ADD COLUMN rate_burst double precision;
