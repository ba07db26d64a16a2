-- SQLite dialect. Parameters are :name; :now is always supplied by the backend
-- (seconds since the epoch), since SQLite has no server clock to defer to.
-- SQLite has a single writer: every write runs under BEGIN IMMEDIATE, so there is
-- no SKIP LOCKED and no lock to skip; claims from several processes serialise.

-- name: job_insert_many
-- One row per execution inside one transaction (sqlite3 is in-process, so a
-- statement costs microseconds, and RETURNING pairs each row with its input).
-- Positional: ?1..?24 are the fields of a JobInsert in order, ?25 the time, so a
-- row binds as the tuple it already is (a dict per row cost a third of a bulk
-- enqueue); executemany runs it for rows that cannot conflict.
INSERT INTO conveyor_jobs (queue, task, args, state, priority, max_attempts, timeout_s,
                           backoff, unique_key, idempotency_key, batch_id, stage, context,
                           chain, chain_root, concurrency_key, concurrency_limit,
                           rate_key, rate_per_s, rate_burst, pinned_to, spread_group, tenant,
                           explicit, created_at, scheduled_at, changed)
VALUES (?1, ?2, ?3, CASE WHEN ?6 > 0 THEN 'scheduled' ELSE 'available' END,
        ?4, ?5, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22,
        ?23, ?24, ?25, ?25 + ?6, {CHANGE})
ON CONFLICT DO NOTHING
RETURNING id, unique_key, idempotency_key, state, queue

-- name: job_ids_after
-- The ids an executemany of job_insert_many just created, in insertion order: under
-- the write lock nobody else inserts, and AUTOINCREMENT ids only grow.
SELECT id FROM conveyor_jobs WHERE id > :after ORDER BY id LIMIT :n

-- name: job_max_id
SELECT coalesce(max(id), 0) AS id FROM conveyor_jobs

-- name: job_claim
-- Run once per queue (the worker rotates the order between claims); the
-- subquery walks the fetch index in order. Due scheduled jobs are claimable.
-- Only tasks the worker has handlers for (:tasks, NULL: any); nothing for code
-- older than the schema (see the PostgreSQL query).
UPDATE conveyor_jobs
SET state = 'running',
    attempt = attempt + 1,
    lease_owner = :worker_id,
    lease_token = lower(hex(randomblob(16))),
    lease_expires_at = :now + :lease_s,
    started_at = :now,
    error = NULL,
    changed = {CHANGE}
WHERE id IN (
    SELECT id FROM conveyor_jobs
    WHERE queue = :queue
      AND state IN ('available', 'scheduled')
      AND scheduled_at <= :now
      AND NOT EXISTS (SELECT 1 FROM conveyor_queues p WHERE p.name = :queue AND p.paused)
      AND (SELECT max(version) FROM conveyor_schema_version) <= :schema_version
      AND concurrency_key IS NULL AND rate_key IS NULL  -- those, and placed jobs:
      AND pinned_to IS NULL AND spread_group IS NULL    -- job_claim_limited
      AND (:tasks IS NULL OR task IN (SELECT value FROM json_each(:tasks)))
    ORDER BY priority DESC, scheduled_at, id
    LIMIT :limit
)
RETURNING *

-- name: job_finalize_one
-- Fencing: only while still running under the outcome's token. Outcome "stage"
-- moves the job to its next stage with a fresh attempt count. A cancel request
-- ends with the run it was for; a job whose cancel was requested ends cancelled
-- unless it failed (see the PostgreSQL job_finalize_many).
UPDATE conveyor_jobs
SET state = CASE WHEN cancel_requested AND :state <> 'failed' THEN 'cancelled' ELSE :state END,
    result = :result_json,
    error = CASE WHEN cancel_requested AND :state NOT IN ('failed', 'cancelled')
                 THEN 'cancelled while running (it finished before its worker learned)'
                 ELSE :error END,
    scheduled_at = CASE WHEN :state = 'scheduled' THEN :now + coalesce(:retry_in_s, 0)
                        WHEN :outcome = 'stage' THEN :now
                        ELSE scheduled_at END,
    finished_at = CASE WHEN :state IN ('succeeded', 'failed', 'cancelled') OR cancel_requested
                       THEN :now END,
    stage = CASE WHEN :outcome = 'stage' AND NOT cancel_requested THEN :next_stage ELSE stage END,
    context = CASE WHEN :outcome = 'stage' AND NOT cancel_requested THEN :context_json
                   ELSE context END,
    attempt = CASE WHEN :outcome = 'stage' THEN 0
                   WHEN :outcome = 'snoozed' THEN max(attempt - 1, 0)
                   ELSE attempt END,
    priority = coalesce(:priority, priority),
    max_attempts = coalesce(:max_attempts, max_attempts),
    cancel_requested = 0,
    -- a success records its worker: its attempt is read from the job row (v12)
    lease_owner = CASE WHEN :state = 'succeeded' AND NOT cancel_requested THEN :worker_id END,
    lease_token = NULL, lease_expires_at = NULL,
    changed = {CHANGE}
WHERE id = :id AND lease_token = :token AND state = 'running'
RETURNING id, started_at, attempt, state, error

-- name: job_succeed_many
-- The common outcome, plain successes (see logic.plain_success), for a whole
-- batch in one statement: the values job_finalize_one gives them, fenced the
-- same way. :batch is a JSON array of [id, token, result text]; every row gets
-- the statement's one change stamp (one transaction, as on PostgreSQL). A
-- statement per row cost 2.5x as much per job (bind, step, row read-back).
UPDATE conveyor_jobs
SET state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'succeeded' END,
    result = json_extract(o.value, '$[2]'),
    error = CASE WHEN cancel_requested
                 THEN 'cancelled while running (it finished before its worker learned)' END,
    finished_at = :now,
    cancel_requested = 0,
    lease_owner = CASE WHEN cancel_requested THEN NULL ELSE :worker_id END,
    lease_token = NULL, lease_expires_at = NULL,
    changed = {CHANGE}
FROM json_each(:batch) AS o
WHERE conveyor_jobs.id = json_extract(o.value, '$[0]')
  AND conveyor_jobs.lease_token = json_extract(o.value, '$[1]')
  AND conveyor_jobs.state = 'running'
RETURNING id, started_at, attempt, state, error

-- name: job_release_one
-- Graceful shutdown: give the job back and un-count the attempt it was on (the
-- backend logs a "released" attempt).
UPDATE conveyor_jobs
SET state = 'available', attempt = max(attempt - 1, 0), cancel_requested = 0,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, changed = {CHANGE}
WHERE id = :id AND lease_token = :token AND state = 'running'
RETURNING id, attempt + 1 AS ran, stage, started_at

-- name: worker_upsert
-- One row per worker and heartbeat (see the PostgreSQL worker_heartbeat).
INSERT INTO conveyor_workers (id, hostname, pid, queues, concurrency, tags, tasks, started_at,
                              last_seen_at)
VALUES (:id, :hostname, :pid, :queues, :concurrency, :tags, :tasks, :now, :now)
ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at
RETURNING stop_requested, started_at = :now AS inserted

-- name: job_expired_leases
-- Running jobs whose worker went silent or was removed, and held jobs past their
-- deadline (see the PostgreSQL job_rescue). Two halves, each read through a
-- partial index of running jobs, sorted once gathered: as one condition with an
-- OR, ordered by id, SQLite walked the whole table by rowid, and the maintenance
-- pass held the write lock for it every second (41 ms at 120,000 finished jobs,
-- growing with the table).
WITH expired AS MATERIALIZED (
    SELECT j.id, j.lease_owner, j.started_at, 'was held past its deadline' AS why
    FROM conveyor_jobs j
    WHERE j.state = 'running' AND j.lease_expires_at < :now     -- conveyor_jobs_lease_idx
    UNION ALL
    SELECT j.id, j.lease_owner, j.started_at, 'stopped heartbeating'
    FROM conveyor_jobs j
    WHERE j.state = 'running' AND j.lease_expires_at IS NULL    -- conveyor_jobs_owner_idx
      AND NOT EXISTS (SELECT 1 FROM conveyor_workers w
                      WHERE w.id = j.lease_owner AND w.last_seen_at >= :now - :worker_ttl_s)
)
SELECT id, lease_owner, started_at, why FROM expired
ORDER BY id
LIMIT :limit

-- name: job_rescue_one
-- The attempt the lost lease was on still counts (crash-loop protection).
UPDATE conveyor_jobs
SET state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'available' END,
    error = printf('lease lost on attempt %d of %d (worker %s %s); %s', attempt, max_attempts,
                   lease_owner, :why,
                   CASE WHEN attempt >= max_attempts THEN 'no attempts left, giving up'
                        ELSE 'requeued' END),
    finished_at = CASE WHEN attempt >= max_attempts THEN :now END,
    cancel_requested = 0,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    changed = {CHANGE}
WHERE id = :id AND state = 'running'
RETURNING id, state, attempt, stage, queue, error

-- name: job_schedule_due
-- (The backend wakes the queues returned.)
UPDATE conveyor_jobs SET state = 'available', changed = {CHANGE}
WHERE id IN (SELECT id FROM conveyor_jobs WHERE state = 'scheduled' AND scheduled_at <= :now
             ORDER BY scheduled_at LIMIT :limit)
RETURNING queue

-- name: schema_version_table
CREATE TABLE IF NOT EXISTS conveyor_schema_version (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL DEFAULT (unixepoch())
)

-- name: schema_version_exists
SELECT count(*) AS present FROM sqlite_master
WHERE type = 'table' AND name = 'conveyor_schema_version'

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

-- name: queue_list
-- (No FULL JOIN before SQLite 3.39 everywhere: a UNION of the two sides.) Counts
-- from the rollup the triggers keep.
SELECT name, max(paused) AS paused, max(max_running) AS max_running,
       max(rate_per_s) AS rate_per_s, max(rate_burst) AS rate_burst,
       coalesce((SELECT json_group_object(state, n) FROM (
                     SELECT state, sum(n) AS n FROM conveyor_counts WHERE queue = name
                     GROUP BY state HAVING sum(n) <> 0)), '{}') AS counts
FROM (SELECT DISTINCT queue AS name, 0 AS paused, NULL AS max_running, NULL AS rate_per_s,
             NULL AS rate_burst FROM conveyor_counts WHERE n <> 0
      UNION ALL SELECT name, paused, max_running, rate_per_s, rate_burst FROM conveyor_queues)
GROUP BY name
ORDER BY name

-- name: job_age_priorities
-- Priority aging (see the PostgreSQL query: only the jobs whose age crossed a
-- multiple of aging_s in the last window_s seconds; every waiting job old enough
-- without a window). Timestamps are epoch seconds; :ks lists 1..max_boost.
UPDATE conveyor_jobs
SET base_priority = coalesce(base_priority, priority),
    priority = coalesce(base_priority, priority)
               + min(:max_boost, CAST((:now - scheduled_at) / :aging_s AS INTEGER))
WHERE id IN (
    SELECT j.id
    FROM (SELECT queue FROM conveyor_counts WHERE state = 'available' AND n > 0) q
    JOIN (SELECT :now - value * :aging_s AS hi, :now - value * :aging_s - :window_s AS lo
          FROM json_each(:ks) WHERE :window_s IS NOT NULL
          UNION ALL
          SELECT :now - :aging_s, -1e18 WHERE :window_s IS NULL) w
    JOIN conveyor_jobs j
      ON j.queue = q.queue AND j.state = 'available'
     AND j.scheduled_at <= w.hi AND j.scheduled_at > w.lo
    WHERE j.priority < coalesce(j.base_priority, j.priority)
                       + min(:max_boost, CAST((:now - j.scheduled_at) / :aging_s AS INTEGER))
    LIMIT :limit)
RETURNING id

-- name: job_prune_ids
-- (See the PostgreSQL query: the IN lets SQLite use the partial finished index.)
SELECT j.id FROM conveyor_jobs j
WHERE j.state = :state AND j.state IN ('succeeded', 'failed', 'cancelled')
  AND j.finished_at < :now - :older_than_s
  AND NOT (j.chain IS NOT NULL AND j.chain_next IS NULL)
  AND NOT EXISTS (SELECT 1 FROM conveyor_batches b WHERE b.id = j.batch_id AND b.state = 'running')
ORDER BY j.finished_at, j.id
LIMIT :limit

-- name: queue_mark_keyed
INSERT INTO conveyor_queues (name, keyed, updated_at) VALUES (:queue, 1, :now)
ON CONFLICT (name) DO UPDATE SET keyed = 1 WHERE NOT conveyor_queues.keyed

-- name: job_claim_limited
-- (See the PostgreSQL query. Claims already serialise under BEGIN IMMEDIATE.)
WITH cand AS (
    SELECT id, concurrency_key, concurrency_limit, rate_key, rate_per_s, rate_burst, spread_group,
           priority, scheduled_at
    FROM conveyor_jobs j
    WHERE queue = :queue AND state IN ('available', 'scheduled') AND scheduled_at <= :now
      AND NOT EXISTS (SELECT 1 FROM conveyor_queues p WHERE p.name = :queue AND p.paused)
      AND (SELECT max(version) FROM conveyor_schema_version) <= :schema_version
      AND (:tasks IS NULL OR task IN (SELECT value FROM json_each(:tasks)))
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
    SELECT concurrency_key, count(*) AS n FROM conveyor_jobs  -- the running-key index (v15)
    WHERE state = 'running' AND concurrency_key IS NOT NULL
      AND concurrency_key IN (SELECT concurrency_key FROM cand)
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
    -- the queue's running jobs are counted only under a queue limit
    SELECT max(0, min(:limit,
        CASE WHEN :max_running IS NULL THEN :limit
             ELSE :max_running - (SELECT count(*) FROM conveyor_jobs
                                  WHERE queue = :queue AND state = 'running')
        END, coalesce((SELECT n FROM queue_tokens), :limit))) AS n
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
    error = NULL,
    changed = {CHANGE}
WHERE id IN (SELECT id FROM picked)
RETURNING *

-- name: rate_spend
INSERT INTO conveyor_rate_limits (key, tokens, updated_at) VALUES (:key, :burst - :taken, :now)
ON CONFLICT (key) DO UPDATE
SET tokens = min(:burst, conveyor_rate_limits.tokens
                 + (excluded.updated_at - conveyor_rate_limits.updated_at) * :rate) - :taken,
    updated_at = excluded.updated_at


-- name: changes_head
-- The largest change stamp so far (see the CHANGE macro). `IS NOT NULL` lets the
-- planner use the partial (changed, id) index: a max() in one step, not a scan.
SELECT max(coalesce((SELECT max(changed) FROM conveyor_jobs WHERE changed IS NOT NULL), 0),
           coalesce((SELECT max(changed) FROM conveyor_batches), 0)) AS head

-- name: counts_fold
-- (Row triggers keep conveyor_counts current in the writing transaction.)
DELETE FROM conveyor_count_deltas

-- name: filter_search
-- (See the PostgreSQL filter_search: a task with sensitive parameters is searched
-- in its other arguments only, one at a time.) A text value is matched as its JSON
-- text (quoted), as in the whole document.
CASE WHEN conveyor_jobs.task IN (SELECT s.task FROM conveyor_task_sensitive s)
THEN EXISTS (
        SELECT 1 FROM json_each(conveyor_jobs.args, '$.kwargs') k
        WHERE k.key NOT IN (SELECT s.name FROM conveyor_task_sensitive s
                            WHERE s.task = conveyor_jobs.task)
          AND (k.key LIKE :f_search ESCAPE '\'
               OR CASE k.type WHEN 'text' THEN json_quote(k.value) WHEN 'true' THEN 'true'
                              WHEN 'false' THEN 'false' WHEN 'null' THEN 'null'
                              ELSE k.value END LIKE :f_search ESCAPE '\'))
  OR EXISTS (
        SELECT 1 FROM json_each(conveyor_jobs.args, '$.args') a
        WHERE a.key NOT IN (SELECT s.position FROM conveyor_task_sensitive s
                            WHERE s.task = conveyor_jobs.task AND s.position IS NOT NULL)
          AND CASE a.type WHEN 'text' THEN json_quote(a.value) WHEN 'true' THEN 'true'
                          WHEN 'false' THEN 'false' WHEN 'null' THEN 'null'
                          ELSE a.value END LIKE :f_search ESCAPE '\')
ELSE conveyor_jobs.args LIKE :f_search ESCAPE '\' END
