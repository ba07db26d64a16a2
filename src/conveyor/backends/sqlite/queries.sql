-- SQLite dialect. Parameters are :name; :now is always supplied by the backend
-- (seconds since the epoch), since SQLite has no server clock to defer to.
-- SQLite has a single writer: every write runs under BEGIN IMMEDIATE, so there is
-- no SKIP LOCKED and no lock to skip; claims from several processes serialise.

-- name: job_insert_many
-- One row per execution inside one transaction (sqlite3 is in-process, so a
-- statement costs microseconds, and RETURNING pairs each row with its input).
INSERT INTO conveyor_jobs (queue, task, args, state, priority, max_attempts, timeout_s,
                           backoff, unique_key, idempotency_key, created_at, scheduled_at)
VALUES (:queue, :task, :args, CASE WHEN :delay_s > 0 THEN 'scheduled' ELSE 'available' END,
        :priority, :max_attempts, :timeout_s, :backoff, :unique_key, :idempotency_key,
        :now, :now + :delay_s)
ON CONFLICT DO NOTHING
RETURNING id, unique_key, idempotency_key, state, queue

-- name: job_find_by_keys
SELECT id, unique_key, idempotency_key FROM conveyor_jobs
WHERE idempotency_key IN (SELECT value FROM json_each(:idempotency_keys))
   OR (unique_key IN (SELECT value FROM json_each(:unique_keys))
       AND state IN ('scheduled', 'available', 'running'))

-- name: job_fetch_available
-- Run once per queue (the worker rotates the order between claims); the
-- subquery walks the fetch index in order. Due scheduled jobs are claimable.
UPDATE conveyor_jobs
SET state = 'running',
    attempt = attempt + 1,
    lease_owner = :worker_id,
    lease_token = lower(hex(randomblob(16))),
    lease_expires_at = :now + :lease_s,
    started_at = :now,
    error = NULL
WHERE id IN (
    SELECT id FROM conveyor_jobs
    WHERE queue = :queue
      AND state IN ('available', 'scheduled')
      AND scheduled_at <= :now
    ORDER BY priority DESC, scheduled_at, id
    LIMIT :limit
)
RETURNING *

-- name: job_finalize_one
-- Fencing: only while still running under the outcome's token.
UPDATE conveyor_jobs
SET state = :state,
    result = :result,
    error = :error,
    scheduled_at = CASE WHEN :state = 'scheduled' THEN :now + :retry_in_s ELSE scheduled_at END,
    finished_at = CASE WHEN :state IN ('succeeded', 'failed', 'cancelled') THEN :now END,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE id = :id AND lease_token = :token AND state = 'running'
RETURNING id, attempt, started_at

-- name: attempt_insert
INSERT INTO conveyor_attempts (job_id, attempt, worker_id, started_at, finished_at, outcome, error, traceback)
VALUES (:job_id, :attempt, :worker_id, :started_at, :now, :outcome, :error, :traceback)

-- name: job_release_one
-- Graceful shutdown: give the job back and un-count the attempt it was on.
UPDATE conveyor_jobs
SET state = 'available', attempt = max(attempt - 1, 0),
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE id = :id AND lease_token = :token AND state = 'running'
RETURNING id

-- name: job_heartbeat
-- All of a worker's leases in one statement; rows missing from the result were lost.
UPDATE conveyor_jobs
SET lease_expires_at = :now + :lease_s
WHERE state = 'running'
  AND id IN (SELECT json_extract(value, '$[0]') FROM json_each(:leases))
  AND (id, lease_token) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                            FROM json_each(:leases))
RETURNING id

-- name: worker_upsert
INSERT INTO conveyor_workers (id, hostname, pid, queues, concurrency, started_at, last_seen_at)
VALUES (:id, :hostname, :pid, :queues, :concurrency, :now, :now)
ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at

-- name: worker_delete
DELETE FROM conveyor_workers WHERE id = :id

-- name: worker_prune_stale
DELETE FROM conveyor_workers WHERE last_seen_at < :now - :older_than_s

-- name: worker_list
SELECT * FROM conveyor_workers ORDER BY started_at

-- name: job_expired_leases
SELECT id, lease_owner, started_at FROM conveyor_jobs
WHERE state = 'running' AND lease_expires_at < :now
ORDER BY lease_expires_at
LIMIT :limit

-- name: job_rescue_one
-- The attempt the lost lease was on still counts (crash-loop protection).
UPDATE conveyor_jobs
SET state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'available' END,
    error = CASE WHEN attempt >= max_attempts
                 THEN printf('lease lost on attempt %d of %d (worker %s stopped renewing it); '
                             || 'no attempts left, giving up', attempt, max_attempts, lease_owner)
                 ELSE printf('lease lost on attempt %d of %d (worker %s stopped renewing it); '
                             || 'requeued', attempt, max_attempts, lease_owner) END,
    finished_at = CASE WHEN attempt >= max_attempts THEN :now END,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE id = :id AND state = 'running'
RETURNING id, state, attempt, queue, error

-- name: job_schedule_due
UPDATE conveyor_jobs SET state = 'available'
WHERE id IN (SELECT id FROM conveyor_jobs WHERE state = 'scheduled' AND scheduled_at <= :now
             ORDER BY scheduled_at LIMIT :limit)
RETURNING queue

-- name: job_get
SELECT * FROM conveyor_jobs WHERE id = :id

-- name: job_list
SELECT * FROM conveyor_jobs
WHERE (:queue IS NULL OR queue = :queue)
  AND (:state IS NULL OR state = :state)
  AND (:task IS NULL OR task = :task)
  AND (:before_id IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit

-- name: job_attempts
SELECT * FROM conveyor_attempts WHERE job_id = :id ORDER BY id

-- name: job_retry
UPDATE conveyor_jobs
SET state = 'available', max_attempts = max(max_attempts, attempt + 1),
    scheduled_at = :now, finished_at = NULL
WHERE id = :id AND state IN ('failed', 'cancelled')
RETURNING queue

-- name: job_cancel
UPDATE conveyor_jobs
SET state = 'cancelled', finished_at = :now, error = 'cancelled before it started'
WHERE id = :id AND state IN ('scheduled', 'available')
RETURNING id

-- name: queue_counts
SELECT queue, state, count(*) AS n FROM conveyor_jobs GROUP BY queue, state ORDER BY queue, state

-- name: schema_version_table
CREATE TABLE IF NOT EXISTS conveyor_schema_version (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL DEFAULT (unixepoch())
)

-- name: schema_version
SELECT coalesce(max(version), 0) FROM conveyor_schema_version

-- name: schema_version_exists
SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'conveyor_schema_version'

-- name: schema_version_insert
INSERT INTO conveyor_schema_version (version, name) VALUES (:version, :name)

-- name: data_version
-- Changes whenever another connection commits to the file: a cheap, read-only
-- way to notice new work from other processes without querying the jobs table.
PRAGMA data_version

-- name: job_peek_available
-- Read-only look before taking the write lock: idle workers of several
-- processes then poll without queueing behind one another for BEGIN IMMEDIATE.
SELECT 1 FROM conveyor_jobs
WHERE queue IN (SELECT value FROM json_each(:queues))
  AND state IN ('available', 'scheduled') AND scheduled_at <= :now
LIMIT 1
