-- SQLite dialect. Parameters are :name; :now is always supplied by the backend
-- (seconds since the epoch), since SQLite has no server clock to defer to.
-- SQLite has a single writer: every write runs under BEGIN IMMEDIATE, so there is
-- no SKIP LOCKED and no lock to skip; claims from several processes serialise.

-- name: job_insert_many
-- One row per execution inside one transaction (sqlite3 is in-process, so a
-- statement costs microseconds, and RETURNING pairs each row with its input).
INSERT INTO conveyor_jobs (queue, task, args, state, priority, max_attempts, timeout_s,
                           backoff, unique_key, idempotency_key, batch_id, stage, context,
                           chain, chain_root, concurrency_key, concurrency_limit,
                           rate_key, rate_per_s, rate_burst, pinned_to, spread_group,
                           created_at, scheduled_at)
VALUES (:queue, :task, :args_json, CASE WHEN :delay_s > 0 THEN 'scheduled' ELSE 'available' END,
        :priority, :max_attempts, :timeout_s, :backoff_json, :unique_key, :idempotency_key,
        :batch_id, :stage, :context_json, :chain_json, :chain_root, :concurrency_key,
        :concurrency_limit, :rate_key, :rate_per_s, :rate_burst, :pinned_to, :spread_group,
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
      AND NOT EXISTS (SELECT 1 FROM conveyor_queues p WHERE p.name = :queue AND p.paused)
      AND concurrency_key IS NULL AND rate_key IS NULL  -- those, and placed jobs:
      AND pinned_to IS NULL AND spread_group IS NULL    -- job_fetch_limited
    ORDER BY priority DESC, scheduled_at, id
    LIMIT :limit
)
RETURNING *

-- name: job_finalize_one
-- Fencing: only while still running under the outcome's token. Outcome "stage"
-- moves the job to its next stage with a fresh attempt count.
UPDATE conveyor_jobs
SET state = :state,
    result = :result_json,
    error = :error,
    scheduled_at = CASE WHEN :state = 'scheduled' THEN :now + coalesce(:retry_in_s, 0)
                        WHEN :outcome = 'stage' THEN :now
                        ELSE scheduled_at END,
    finished_at = CASE WHEN :state IN ('succeeded', 'failed', 'cancelled') THEN :now END,
    stage = CASE WHEN :outcome = 'stage' THEN :next_stage ELSE stage END,
    context = CASE WHEN :outcome = 'stage' THEN :context_json ELSE context END,
    attempt = CASE WHEN :outcome = 'stage' THEN 0
                   WHEN :outcome = 'snoozed' THEN max(attempt - 1, 0)
                   ELSE attempt END,
    priority = coalesce(:priority, priority),
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE id = :id AND lease_token = :token AND state = 'running'
RETURNING id, started_at, attempt

-- name: attempt_insert
INSERT INTO conveyor_attempts (job_id, attempt, stage, worker_id, started_at, finished_at,
                               outcome, error, traceback)
VALUES (:job_id, :attempt, :stage, :worker_id, :started_at, :now, :outcome, :error, :traceback)

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
RETURNING id, cancel_requested

-- name: worker_upsert
INSERT INTO conveyor_workers (id, hostname, pid, queues, concurrency, tags, started_at,
                              last_seen_at)
VALUES (:id, :hostname, :pid, :queues, :concurrency, :tags, :now, :now)
ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at
RETURNING stop_requested

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
RETURNING id, state, attempt, stage, queue, error

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
  AND queue NOT IN (SELECT name FROM conveyor_queues WHERE paused)
  AND state IN ('available', 'scheduled') AND scheduled_at <= :now
LIMIT 1

-- name: batch_insert
-- ON CONFLICT on the idempotency key: a request seen before returns no row.
INSERT INTO conveyor_batches (name, task, total, state, idempotency_key, on_complete, created_at)
VALUES (:name, :task, :total, 'running', :idempotency_key, :on_complete, :now)
ON CONFLICT DO NOTHING
RETURNING id

-- name: batch_find_by_key
SELECT id FROM conveyor_batches WHERE idempotency_key = :idempotency_key

-- name: batch_get
SELECT * FROM conveyor_batches WHERE id = :id

-- name: batch_list
SELECT * FROM conveyor_batches
WHERE (:state IS NULL OR state = :state)
  AND (:before_id IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit

-- name: batch_progress
-- One GROUP BY over the (batch_id, state) index: no counters on the batch row.
SELECT state, count(*) AS n FROM conveyor_jobs WHERE batch_id = :id GROUP BY state

-- name: batch_finished_jobs
SELECT * FROM conveyor_jobs
WHERE batch_id = :id AND state IN ('succeeded', 'failed', 'cancelled')
  AND (finished_at, id) > (:after_at, :after_id)
ORDER BY finished_at, id
LIMIT :limit

-- name: batch_jobs
SELECT * FROM conveyor_jobs WHERE batch_id = :id ORDER BY id

-- name: batch_mark_cancelled
UPDATE conveyor_batches SET cancelled_at = :now WHERE id = :id AND state = 'running'
RETURNING id

-- name: batch_cancel_jobs
UPDATE conveyor_jobs
SET state = 'cancelled', finished_at = :now, error = 'cancelled with its batch'
WHERE batch_id = :id AND state IN ('scheduled', 'available')

-- name: batch_reopen
UPDATE conveyor_batches SET state = 'running', finished_at = NULL, counts = NULL, cancelled_at = NULL
WHERE id = :id AND EXISTS (SELECT 1 FROM conveyor_jobs WHERE batch_id = :id AND state = 'failed')
RETURNING id

-- name: batch_retry_jobs
UPDATE conveyor_jobs
SET state = 'available', max_attempts = max(max_attempts, attempt + 1), scheduled_at = :now,
    finished_at = NULL
WHERE batch_id = :id AND state = 'failed'

-- name: batch_ready
SELECT b.id FROM conveyor_batches b
WHERE b.state = 'running'
  AND NOT EXISTS (SELECT 1 FROM conveyor_jobs j
                  WHERE j.batch_id = b.id AND j.state IN ('scheduled', 'available', 'running'))
ORDER BY b.id
LIMIT :limit

-- name: batch_lock_open
-- (Under BEGIN IMMEDIATE the whole closing transaction holds the write lock.)
SELECT * FROM conveyor_batches WHERE id = :id AND state = 'running'

-- name: batch_mark_closed
UPDATE conveyor_batches
SET state = :state, counts = :counts, closings = closings + 1, finished_at = :now
WHERE id = :id AND state = 'running'
RETURNING *

-- name: job_chain_get
SELECT chain FROM conveyor_jobs WHERE id = :id AND chain_next IS NULL

-- name: job_chain_set
-- (SQLite has no jsonb ||: the backend appends in Python under the write lock.)
UPDATE conveyor_jobs SET chain = :chain WHERE id = :id AND chain_next IS NULL

-- name: job_chain_due
SELECT id, state, result, error, chain, chain_root FROM conveyor_jobs
WHERE chain IS NOT NULL AND chain_next IS NULL AND state IN ('succeeded', 'failed', 'cancelled')
ORDER BY id
LIMIT :limit

-- name: job_chain_link
UPDATE conveyor_jobs SET chain_next = :next_id WHERE id = :id AND chain_next IS NULL
RETURNING id

-- name: leader_attempt_elect
INSERT INTO conveyor_leaders (name, holder, expires_at) VALUES (:name, :holder, :now + :ttl_s)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE conveyor_leaders.holder = excluded.holder OR conveyor_leaders.expires_at < :now
RETURNING holder

-- name: leader_resign
DELETE FROM conveyor_leaders WHERE name = :name AND holder = :holder

-- name: job_request_cancel
UPDATE conveyor_jobs SET cancel_requested = 1 WHERE id = :id AND state = 'running'
RETURNING id

-- name: worker_request_stop
UPDATE conveyor_workers SET stop_requested = 1 WHERE id = :id
RETURNING id

-- name: queue_set_paused
INSERT INTO conveyor_queues (name, paused, updated_at) VALUES (:name, :paused, :now)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at

-- name: queue_list
-- (No FULL JOIN before SQLite 3.39 everywhere: a UNION of the two sides.)
SELECT name, max(paused) AS paused, max(max_running) AS max_running,
       coalesce((SELECT json_group_object(state, n) FROM
                   (SELECT state, count(*) AS n FROM conveyor_jobs WHERE queue = name GROUP BY state)),
                '{}') AS counts
FROM (SELECT DISTINCT queue AS name, 0 AS paused, NULL AS max_running FROM conveyor_jobs
      UNION ALL SELECT name, paused, max_running FROM conveyor_queues)
GROUP BY name
ORDER BY name

-- name: job_age_priorities
-- Priority aging (see the PostgreSQL query); timestamps are epoch seconds here.
UPDATE conveyor_jobs
SET base_priority = coalesce(base_priority, priority),
    priority = coalesce(base_priority, priority)
               + min(:max_boost, CAST((:now - scheduled_at) / :aging_s AS INTEGER))
WHERE id IN (SELECT id FROM conveyor_jobs
             WHERE state IN ('available', 'scheduled') AND scheduled_at <= :now - :aging_s
             ORDER BY scheduled_at LIMIT :limit)
  AND priority < coalesce(base_priority, priority)
                 + min(:max_boost, CAST((:now - scheduled_at) / :aging_s AS INTEGER))
RETURNING id

-- name: job_prune_ids
SELECT j.id FROM conveyor_jobs j
WHERE j.state = :state AND j.finished_at < :now - :older_than_s
  AND NOT (j.chain IS NOT NULL AND j.chain_next IS NULL)
  AND NOT EXISTS (SELECT 1 FROM conveyor_batches b WHERE b.id = j.batch_id AND b.state = 'running')
ORDER BY j.id
LIMIT :limit

-- name: job_prune_count
SELECT count(*) AS n FROM conveyor_jobs j
WHERE j.state = :state AND j.finished_at < :now - :older_than_s
  AND NOT (j.chain IS NOT NULL AND j.chain_next IS NULL)
  AND NOT EXISTS (SELECT 1 FROM conveyor_batches b WHERE b.id = j.batch_id AND b.state = 'running')

-- name: job_delete_ids
DELETE FROM conveyor_jobs WHERE id IN (SELECT value FROM json_each(:ids))

-- name: attempt_delete_ids
DELETE FROM conveyor_attempts WHERE job_id IN (SELECT value FROM json_each(:ids))

-- name: queue_limits
SELECT name, max_running, keyed, rate_per_s, rate_burst FROM conveyor_queues
WHERE name IN (SELECT value FROM json_each(:queues))

-- name: queue_set_limit
INSERT INTO conveyor_queues (name, max_running, updated_at) VALUES (:name, :max_running, :now)
ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running, updated_at = excluded.updated_at

-- name: queue_mark_keyed
INSERT INTO conveyor_queues (name, keyed, updated_at) VALUES (:queue, 1, :now)
ON CONFLICT (name) DO UPDATE SET keyed = 1 WHERE NOT conveyor_queues.keyed

-- name: job_fetch_limited
-- (See the PostgreSQL query. Claims already serialise under BEGIN IMMEDIATE.)
WITH cand AS (
    SELECT id, concurrency_key, concurrency_limit, rate_key, rate_per_s, rate_burst, spread_group,
           priority, scheduled_at
    FROM conveyor_jobs j
    WHERE queue = :queue AND state IN ('available', 'scheduled') AND scheduled_at <= :now
      AND NOT EXISTS (SELECT 1 FROM conveyor_queues p WHERE p.name = :queue AND p.paused)
      AND (pinned_to IS NULL OR EXISTS (
               SELECT 1 FROM json_each(j.pinned_to) pin
               WHERE pin.value IN (SELECT value FROM json_each(:identity))))
      AND (spread_group IS NULL OR NOT EXISTS (
               SELECT 1 FROM conveyor_jobs g
               WHERE g.spread_group = j.spread_group AND g.id <> j.id
                 AND (g.lease_owner = :worker_id
                      OR EXISTS (SELECT 1 FROM conveyor_attempts a
                                 WHERE a.job_id = g.id AND a.worker_id = :worker_id))))
    ORDER BY priority DESC, scheduled_at, id
    LIMIT :window
), ranked AS (
    SELECT c.*,
           row_number() OVER (PARTITION BY c.concurrency_key
                              ORDER BY c.priority DESC, c.scheduled_at, c.id) AS rn,
           row_number() OVER (PARTITION BY c.rate_key
                              ORDER BY c.priority DESC, c.scheduled_at, c.id) AS rate_rn,
           row_number() OVER (PARTITION BY c.spread_group
                              ORDER BY c.priority DESC, c.scheduled_at, c.id) AS spread_rn
    FROM cand c
), busy AS (
    SELECT concurrency_key, count(*) AS n FROM conveyor_jobs
    WHERE state = 'running' AND concurrency_key IN (SELECT concurrency_key FROM cand)
    GROUP BY concurrency_key
), bucket AS (
    SELECT k.rate_key,
           min(k.burst, coalesce(b.tokens + (:now - b.updated_at) * k.rate, k.burst)) AS tokens
    FROM (SELECT rate_key, max(rate_per_s) AS rate, max(rate_burst) AS burst FROM cand
          WHERE rate_key IS NOT NULL GROUP BY rate_key) k
    LEFT JOIN conveyor_rate_limits b ON b.key = k.rate_key
), queue_tokens AS (  -- the queue's own rate limit, if it has one
    SELECT CAST(min(:queue_burst, coalesce(b.tokens + (:now - b.updated_at) * :queue_rate,
                                           :queue_burst)) AS INTEGER) AS n
    FROM (SELECT 1) LEFT JOIN conveyor_rate_limits b ON b.key = 'queue=' || :queue
    WHERE :queue_rate IS NOT NULL
), room AS (
    SELECT max(0, min(:limit, coalesce(:max_running - (
        SELECT count(*) FROM conveyor_jobs WHERE queue = :queue AND state = 'running'),
        :limit), coalesce((SELECT n FROM queue_tokens), :limit))) AS n
), picked AS (
    SELECT r.id FROM ranked r
    LEFT JOIN busy b ON b.concurrency_key = r.concurrency_key
    LEFT JOIN bucket k ON k.rate_key = r.rate_key
    WHERE (r.concurrency_key IS NULL OR r.rn + coalesce(b.n, 0) <= r.concurrency_limit)
      AND (r.rate_key IS NULL OR r.rate_rn <= CAST(k.tokens AS INTEGER))
      AND (r.spread_group IS NULL OR r.spread_rn = 1)  -- one per group per claim
    ORDER BY r.priority DESC, r.scheduled_at, r.id
    LIMIT (SELECT n FROM room)
)
UPDATE conveyor_jobs
SET state = 'running',
    attempt = attempt + 1,
    lease_owner = :worker_id,
    lease_token = lower(hex(randomblob(16))),
    lease_expires_at = :now + :lease_s,
    started_at = :now,
    error = NULL
WHERE id IN (SELECT id FROM picked)
RETURNING *

-- name: rate_spend
INSERT INTO conveyor_rate_limits (key, tokens, updated_at) VALUES (:key, :burst - :taken, :now)
ON CONFLICT (key) DO UPDATE
SET tokens = min(:burst, conveyor_rate_limits.tokens
                 + (excluded.updated_at - conveyor_rate_limits.updated_at) * :rate) - :taken,
    updated_at = excluded.updated_at

-- name: queue_set_rate
INSERT INTO conveyor_queues (name, rate_per_s, rate_burst, updated_at)
VALUES (:name, :rate_per_s, :rate_burst, :now)
ON CONFLICT (name) DO UPDATE SET rate_per_s = excluded.rate_per_s,
    rate_burst = excluded.rate_burst, updated_at = excluded.updated_at
