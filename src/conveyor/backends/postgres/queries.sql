-- PostgreSQL dialect. Parameters are psycopg's %(name)s, or %(name)b where arrays
-- are sent (binary arrays skip psycopg's per-element text escaping, the largest
-- client-side cost of a 1,000-row insert). A NULL %(now)s means the server's
-- clock, so every machine of a cluster agrees on lease expiry. Single statements
-- run in autocommit: no BEGIN/COMMIT round trips on the hot paths.

-- name: job_insert_many
-- One statement for the whole chunk: arrays in, unnest, one row per job.
-- A column whose value is the same for every job of the chunk (queue, task,
-- options, batch id: all of them, for send_many) travels as one scalar
-- %(x_all)s beside an empty array; unnest pads the short arrays with NULLs and
-- coalesce() fills them in. Only args always travels as a full array.
-- WITH ORDINALITY + ORDER BY makes ids follow input order, which is how the
-- caller maps returned ids back to its inputs. ON CONFLICT DO NOTHING (no
-- target) covers both the unique_key and the idempotency_key indexes; the
-- backend drops that clause for chunks without keys (it costs ~10% of the
-- insert). The NOTIFY rides in the same statement and is delivered at commit,
-- so an enqueue rolled back with the caller's transaction wakes nobody.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), v AS (
    SELECT i.ord, i.args,
           coalesce(i.queue, %(queue_all)s::text) AS queue,
           coalesce(i.task, %(task_all)s::text) AS task,
           coalesce(i.priority, %(priority_all)s::int) AS priority,
           coalesce(i.max_attempts, %(max_attempts_all)s::int) AS max_attempts,
           coalesce(i.timeout_s, %(timeout_s_all)s::float8) AS timeout_s,
           coalesce(i.backoff, %(backoff_all)s::jsonb) AS backoff,
           coalesce(i.unique_key, %(unique_key_all)s::text) AS unique_key,
           coalesce(i.idempotency_key, %(idempotency_key_all)s::text) AS idempotency_key,
           coalesce(i.delay_s, %(delay_s_all)s::float8) AS delay_s,
           coalesce(i.batch_id, %(batch_id_all)s::bigint) AS batch_id,
           coalesce(i.stage, %(stage_all)s::text) AS stage,
           coalesce(i.context, %(context_all)s::jsonb) AS context,
           coalesce(i.chain, %(chain_all)s::jsonb) AS chain,
           coalesce(i.chain_root, %(chain_root_all)s::bigint) AS chain_root,
           coalesce(i.concurrency_key, %(concurrency_key_all)s::text) AS concurrency_key,
           coalesce(i.concurrency_limit, %(concurrency_limit_all)s::int) AS concurrency_limit,
           coalesce(i.rate_key, %(rate_key_all)s::text) AS rate_key,
           coalesce(i.rate_per_s, %(rate_per_s_all)s::float8) AS rate_per_s,
           coalesce(i.rate_burst, %(rate_burst_all)s::float8) AS rate_burst,
           coalesce(i.pinned_to, %(pinned_to_all)s::jsonb) AS pinned_to,
           coalesce(i.spread_group, %(spread_group_all)s::text) AS spread_group
    FROM unnest(%(args)b::text[]::jsonb[], %(queue)b::text[], %(task)b::text[],
                %(priority)b::int[], %(max_attempts)b::int[], %(timeout_s)b::float8[],
                %(backoff)b::text[]::jsonb[], %(unique_key)b::text[],
                %(idempotency_key)b::text[], %(delay_s)b::float8[], %(batch_id)b::bigint[],
                %(stage)b::text[], %(context)b::text[]::jsonb[], %(chain)b::text[]::jsonb[],
                %(chain_root)b::bigint[], %(concurrency_key)b::text[], %(concurrency_limit)b::int[],
                %(rate_key)b::text[], %(rate_per_s)b::float8[], %(rate_burst)b::float8[],
                %(pinned_to)b::text[]::jsonb[], %(spread_group)b::text[])
         WITH ORDINALITY AS i(args, queue, task, priority, max_attempts, timeout_s, backoff,
                              unique_key, idempotency_key, delay_s, batch_id, stage, context,
                              chain, chain_root, concurrency_key, concurrency_limit, rate_key,
                              rate_per_s, rate_burst, pinned_to, spread_group, ord)
), ins AS (
    INSERT INTO conveyor_jobs (queue, task, args, state, priority, max_attempts, timeout_s,
                               backoff, unique_key, idempotency_key, batch_id, stage, context,
                               chain, chain_root, concurrency_key, concurrency_limit,
                               rate_key, rate_per_s, rate_burst, pinned_to, spread_group,
                               created_at, scheduled_at)
    SELECT v.queue, v.task, v.args,
           CASE WHEN v.delay_s > 0 THEN 'scheduled' ELSE 'available' END,
           v.priority, v.max_attempts, v.timeout_s, v.backoff, v.unique_key, v.idempotency_key,
           v.batch_id, v.stage, v.context, v.chain, v.chain_root, v.concurrency_key,
           v.concurrency_limit, v.rate_key, v.rate_per_s, v.rate_burst, v.pinned_to,
           v.spread_group,
           t.now, t.now + make_interval(secs => v.delay_s)
    FROM v, t
    ORDER BY v.ord
    ON CONFLICT DO NOTHING
    RETURNING id, unique_key, idempotency_key, state, queue
), woken AS (
    SELECT pg_notify(%(channel)s, q) FROM (SELECT DISTINCT queue AS q FROM ins WHERE state = 'available') s
)
SELECT id, unique_key, idempotency_key, (SELECT count(*) FROM woken) AS notified FROM ins

-- name: job_find_by_keys
-- Existing jobs behind keys that conflicted: idempotency keys forever, unique keys
-- only while unfinished (the same predicate as the partial unique index).
SELECT id, unique_key, idempotency_key FROM conveyor_jobs
WHERE idempotency_key = ANY(%(idempotency_keys)s::text[])
   OR (unique_key = ANY(%(unique_keys)s::text[])
       AND state IN ('scheduled', 'available', 'running'))



-- name: job_fetch_available
-- Claim: SKIP LOCKED lets many workers claim concurrently without waiting on
-- one another. One LATERAL probe per queue keeps each an ordered walk of the
-- fetch index (queue = ANY(...) with ORDER BY would sort every claimable row on
-- PG 15); the outer LIMIT stops pulling, and locking, once enough are found.
-- The worker rotates the queue order between claims so no queue starves.
-- Due scheduled jobs are claimable directly: a retry or delay does not wait for
-- the scheduler's next pass. JSON columns come back as text: decoding str is
-- cheaper than psycopg's bytes path, and the backend decodes them itself.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), picked AS (
    SELECT c.id
    FROM (SELECT name FROM unnest(%(queues)b::text[]) AS u(name)
          WHERE NOT EXISTS (SELECT 1 FROM conveyor_queues p WHERE p.name = u.name AND p.paused)
         ) AS q, t,
         LATERAL (
             SELECT id FROM conveyor_jobs
             WHERE queue = q.name
               AND state IN ('available', 'scheduled')
               AND scheduled_at <= t.now
               AND concurrency_key IS NULL AND rate_key IS NULL  -- those, and placed jobs:
               AND pinned_to IS NULL AND spread_group IS NULL    -- job_fetch_limited
             ORDER BY priority DESC, scheduled_at, id
             LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED
         ) c
    LIMIT %(limit)s
)
UPDATE conveyor_jobs j
SET state = 'running',
    attempt = j.attempt + 1,
    lease_owner = %(worker_id)s,
    lease_token = gen_random_uuid()::text,
    lease_expires_at = t.now + make_interval(secs => %(lease_s)s),
    started_at = t.now,
    error = NULL
FROM picked, t
WHERE j.id = picked.id
RETURNING j.id, j.queue, j.task, j.args::text AS args, j.state, j.priority, j.attempt,
          j.max_attempts, j.timeout_s, j.backoff::text AS backoff, j.stage, j.unique_key,
          j.idempotency_key, NULL::text AS result, j.error, j.lease_owner, j.lease_token,
          j.lease_expires_at, j.created_at, j.scheduled_at, j.started_at, j.finished_at,
          j.batch_id, j.context::text AS context, j.chain_root

-- name: job_finalize_many
-- Fencing: a row is only touched while it is still running under the token the
-- outcome carries; the attempt is recorded for exactly the rows that were.
-- Columns the same for the whole batch of outcomes travel as scalars (see
-- job_insert_many). Outcome "stage" moves the job to its next stage with a
-- fresh attempt count. Jobs that became available wake workers of their queue;
-- finished jobs of a batch or chain wake the flow service ("@flow").
WITH i AS (
    SELECT u.id, u.token,
           coalesce(u.state, %(state_all)s::text) AS state,
           coalesce(u.outcome, %(outcome_all)s::text) AS outcome,
           coalesce(u.result, %(result_json_all)s::jsonb) AS result,
           coalesce(u.error, %(error_all)s::text) AS error,
           coalesce(u.traceback, %(traceback_all)s::text) AS traceback,
           coalesce(u.retry_in_s, %(retry_in_s_all)s::float8) AS retry_in_s,
           coalesce(u.ran_attempt, %(ran_attempt_all)s::int) AS ran_attempt,
           coalesce(u.ran_stage, %(ran_stage_all)s::text) AS ran_stage,
           coalesce(u.next_stage, %(next_stage_all)s::text) AS next_stage,
           coalesce(u.context, %(context_json_all)s::jsonb) AS context,
           coalesce(u.priority, %(priority_all)s::int) AS priority
    FROM unnest(%(id)b::bigint[], %(token)b::text[], %(state)b::text[], %(outcome)b::text[],
                %(result_json)b::text[]::jsonb[], %(error)b::text[], %(traceback)b::text[],
                %(retry_in_s)b::float8[], %(ran_attempt)b::int[], %(ran_stage)b::text[],
                %(next_stage)b::text[], %(context_json)b::text[]::jsonb[], %(priority)b::int[])
         AS u(id, token, state, outcome, result, error, traceback, retry_in_s, ran_attempt,
              ran_stage, next_stage, context, priority)
), t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), done AS (
    UPDATE conveyor_jobs j
    SET state = i.state,
        result = i.result,
        error = i.error,
        scheduled_at = CASE WHEN i.state = 'scheduled'
                            THEN t.now + make_interval(secs => coalesce(i.retry_in_s, 0))
                            WHEN i.outcome = 'stage' THEN t.now
                            ELSE j.scheduled_at END,
        finished_at = CASE WHEN i.state IN ('succeeded', 'failed', 'cancelled') THEN t.now END,
        stage = CASE WHEN i.outcome = 'stage' THEN i.next_stage ELSE j.stage END,
        context = CASE WHEN i.outcome = 'stage' THEN i.context ELSE j.context END,
        attempt = CASE WHEN i.outcome = 'stage' THEN 0
                       WHEN i.outcome = 'snoozed' THEN greatest(j.attempt - 1, 0)
                       ELSE j.attempt END,
        priority = coalesce(i.priority, j.priority),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM i, t
    -- A lease token is non-null only while the job runs (claims set it, every way
    -- out of 'running' clears it), so id + token is the whole fence. Not also
    -- "state = 'running'": that matches the partial lease index, and a generic
    -- plan after an ANALYZE that saw no running jobs then nested-loops over them.
    WHERE j.id = i.id AND j.lease_token = i.token
    RETURNING j.id, j.queue, j.state, j.attempt, j.started_at,
              (j.batch_id IS NOT NULL OR j.chain IS NOT NULL) AS flow
), woken AS (
    SELECT pg_notify(%(channel)s, q) FROM (
        SELECT DISTINCT queue AS q FROM done WHERE state = 'available'
        UNION
        -- a job leaving 'running' in a limited queue makes room: wake its workers
        SELECT DISTINCT d.queue FROM done d
        WHERE EXISTS (SELECT 1 FROM conveyor_queues q
                      WHERE q.name = d.queue AND (q.max_running IS NOT NULL OR q.keyed))
        UNION
        SELECT '@flow' FROM done WHERE flow AND state IN ('succeeded', 'failed', 'cancelled')
    ) s
), logged AS (
    INSERT INTO conveyor_attempts (job_id, attempt, stage, worker_id, started_at, finished_at,
                                   outcome, error, traceback)
    SELECT done.id, coalesce(i.ran_attempt, done.attempt), i.ran_stage, %(worker_id)s, done.started_at, t.now,
           i.outcome, i.error, i.traceback
    FROM done JOIN i ON i.id = done.id, t
    RETURNING job_id
)
SELECT job_id, (SELECT count(*) FROM woken) AS notified FROM logged

-- name: job_release_many
-- Graceful shutdown: give the job back and un-count the attempt it was on.
WITH released AS (
    UPDATE conveyor_jobs j
    SET state = 'available', attempt = greatest(j.attempt - 1, 0),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM unnest(%(id)b::bigint[], %(token)b::text[]) AS l(id, token)
    WHERE j.id = l.id AND j.lease_token = l.token  -- the token fences (see job_finalize_many)
    RETURNING j.id, j.queue
), woken AS (
    SELECT pg_notify(%(channel)s, q) FROM (SELECT DISTINCT queue AS q FROM released) s
)
SELECT id, (SELECT count(*) FROM woken) AS notified FROM released

-- name: job_heartbeat
-- All of a worker's leases in one statement; rows missing from the result were
-- lost (rescued, or finished by someone else) and the worker must stop them.
-- cancel_requested tells the worker to cancel that run.
UPDATE conveyor_jobs j
SET lease_expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_s)s)
FROM unnest(%(id)b::bigint[], %(token)b::text[]) AS l(id, token)
WHERE j.id = l.id AND j.lease_token = l.token  -- the token fences (see job_finalize_many)
RETURNING j.id, j.cancel_requested

-- name: worker_upsert
INSERT INTO conveyor_workers (id, hostname, pid, queues, concurrency, tags, started_at,
                              last_seen_at)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s, %(tags)s,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at
RETURNING stop_requested

-- name: worker_delete
DELETE FROM conveyor_workers WHERE id = %(id)s

-- name: worker_prune_stale
DELETE FROM conveyor_workers
WHERE last_seen_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than_s)s)

-- name: worker_list
SELECT * FROM conveyor_workers ORDER BY started_at

-- name: job_rescue_expired
-- Expired leases: the holder stopped renewing (crashed, hung, partitioned).
-- The attempt it was on still counts, so a job that kills its worker every time
-- ends failed after max_attempts instead of looping forever.
WITH expired AS (
    SELECT id, lease_owner, started_at FROM conveyor_jobs
    WHERE state = 'running' AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), moved AS (
    UPDATE conveyor_jobs j
    SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'failed' ELSE 'available' END,
        error = CASE WHEN j.attempt >= j.max_attempts
                     THEN format('lease lost on attempt %%s of %%s (worker %%s stopped renewing it); '
                                 'no attempts left, giving up', j.attempt, j.max_attempts, e.lease_owner)
                     ELSE format('lease lost on attempt %%s of %%s (worker %%s stopped renewing it); '
                                 'requeued', j.attempt, j.max_attempts, e.lease_owner) END,
        finished_at = CASE WHEN j.attempt >= j.max_attempts THEN t.now END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM expired e, t
    WHERE j.id = e.id
    RETURNING j.id, j.state, j.attempt, j.stage, j.queue, j.error,
              (j.batch_id IS NOT NULL OR j.chain IS NOT NULL) AS flow
), logged AS (
    INSERT INTO conveyor_attempts (job_id, attempt, stage, worker_id, started_at, finished_at,
                                   outcome, error)
    SELECT m.id, m.attempt, m.stage, e.lease_owner, e.started_at, t.now, 'lost', m.error
    FROM moved m JOIN expired e ON e.id = m.id, t
), woken AS (
    SELECT pg_notify(%(channel)s, q) FROM (
        SELECT DISTINCT queue AS q FROM moved WHERE state = 'available'
        UNION
        SELECT '@flow' FROM moved WHERE flow AND state = 'failed'
    ) s
)
SELECT id, state, (SELECT count(*) FROM woken) AS notified FROM moved

-- name: job_schedule_due
WITH due AS (
    SELECT id FROM conveyor_jobs
    WHERE state = 'scheduled' AND scheduled_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY scheduled_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE conveyor_jobs j SET state = 'available' FROM due WHERE j.id = due.id
    RETURNING j.queue
), woken AS (
    SELECT pg_notify(%(channel)s, q) FROM (SELECT DISTINCT queue AS q FROM moved) s
)
SELECT count(*) AS n, (SELECT count(*) FROM woken) AS notified FROM moved

-- name: job_get
SELECT * FROM conveyor_jobs WHERE id = %(id)s

-- name: job_list
SELECT * FROM conveyor_jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_attempts
SELECT * FROM conveyor_attempts WHERE job_id = %(id)s ORDER BY id

-- name: job_retry
-- Operator retry: allow at least one more attempt than were made.
WITH moved AS (
    UPDATE conveyor_jobs
    SET state = 'available', max_attempts = greatest(max_attempts, attempt + 1),
        scheduled_at = coalesce(%(now)s::timestamptz, now()), finished_at = NULL
    WHERE id = %(id)s AND state IN ('failed', 'cancelled')
    RETURNING queue
)
SELECT pg_notify(%(channel)s, queue) FROM moved

-- name: job_cancel
UPDATE conveyor_jobs
SET state = 'cancelled', finished_at = coalesce(%(now)s::timestamptz, now()),
    error = 'cancelled before it started'
WHERE id = %(id)s AND state IN ('scheduled', 'available')
RETURNING id

-- name: queue_counts
SELECT queue, state, count(*) AS n FROM conveyor_jobs GROUP BY queue, state ORDER BY queue, state

-- name: schema_version_table
CREATE TABLE IF NOT EXISTS conveyor_schema_version (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: schema_version
SELECT coalesce(max(version), 0) FROM conveyor_schema_version

-- name: schema_version_exists
SELECT to_regclass('conveyor_schema_version') IS NOT NULL

-- name: schema_version_insert
INSERT INTO conveyor_schema_version (version, name) VALUES (%(version)s, %(name)s)

-- name: migration_lock
-- Two processes migrating at once: the second waits, then finds nothing to do.
SELECT pg_advisory_xact_lock(7262837501)

-- name: batch_insert
-- ON CONFLICT on the idempotency key: a request seen before returns no row,
-- and the backend then returns the existing batch without inserting jobs.
INSERT INTO conveyor_batches (name, task, total, state, idempotency_key, on_complete, created_at)
VALUES (%(name)s, %(task)s, %(total)s, 'running', %(idempotency_key)s, %(on_complete)s::jsonb,
        coalesce(%(now)s::timestamptz, now()))
ON CONFLICT DO NOTHING
RETURNING id

-- name: batch_find_by_key
SELECT id FROM conveyor_batches WHERE idempotency_key = %(idempotency_key)s

-- name: batch_get
SELECT * FROM conveyor_batches WHERE id = %(id)s

-- name: batch_list
SELECT * FROM conveyor_batches
WHERE (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
ORDER BY id DESC
LIMIT %(limit)s

-- name: batch_progress
-- One GROUP BY over the (batch_id, state) index: no counters on the batch row.
SELECT state, count(*) AS n FROM conveyor_jobs WHERE batch_id = %(id)s GROUP BY state

-- name: batch_finished_jobs
SELECT * FROM conveyor_jobs
WHERE batch_id = %(id)s AND state IN ('succeeded', 'failed', 'cancelled')
  AND (finished_at, id) > (%(after_at)s::timestamptz, %(after_id)s::bigint)
ORDER BY finished_at, id
LIMIT %(limit)s

-- name: batch_jobs
SELECT * FROM conveyor_jobs WHERE batch_id = %(id)s ORDER BY id

-- name: batch_cancel
-- Pending jobs are cancelled now; running ones finish; the aggregator then
-- closes the batch as cancelled (cancelled_at) and runs no callback.
WITH b AS (
    UPDATE conveyor_batches SET cancelled_at = coalesce(%(now)s::timestamptz, now())
    WHERE id = %(id)s AND state = 'running'
    RETURNING id
), cancelled AS (
    UPDATE conveyor_jobs j
    SET state = 'cancelled', finished_at = coalesce(%(now)s::timestamptz, now()),
        error = 'cancelled with its batch'
    FROM b
    WHERE j.batch_id = b.id AND j.state IN ('scheduled', 'available')
    RETURNING j.id
), woken AS (
    SELECT pg_notify(%(channel)s, '@flow') FROM b
)
SELECT (SELECT count(*) FROM cancelled) AS n, (SELECT count(*) FROM woken) AS notified

-- name: batch_retry_failed
-- Reopen the batch (state running, a new closing number keys the next callback)
-- and give each failed job one more attempt.
WITH b AS (
    UPDATE conveyor_batches SET state = 'running', finished_at = NULL, counts = NULL,
                                cancelled_at = NULL
    WHERE id = %(id)s AND EXISTS (SELECT 1 FROM conveyor_jobs
                                  WHERE batch_id = %(id)s AND state = 'failed')
    RETURNING id
), moved AS (
    UPDATE conveyor_jobs j
    SET state = 'available', max_attempts = greatest(j.max_attempts, j.attempt + 1),
        scheduled_at = coalesce(%(now)s::timestamptz, now()), finished_at = NULL
    FROM b
    WHERE j.batch_id = b.id AND j.state = 'failed'
    RETURNING j.queue
), woken AS (
    SELECT pg_notify(%(channel)s, q) FROM (SELECT DISTINCT queue AS q FROM moved) s
)
SELECT (SELECT count(*) FROM moved) AS n, (SELECT count(*) FROM woken) AS notified

-- name: batch_ready
SELECT b.id FROM conveyor_batches b
WHERE b.state = 'running'
  AND NOT EXISTS (SELECT 1 FROM conveyor_jobs j
                  WHERE j.batch_id = b.id AND j.state IN ('scheduled', 'available', 'running'))
ORDER BY b.id
LIMIT %(limit)s

-- name: batch_lock_open
-- Row lock for the closing transaction: a second aggregator (a leader handover
-- overlap) waits here and then finds the batch closed.
SELECT * FROM conveyor_batches WHERE id = %(id)s AND state = 'running' FOR UPDATE

-- name: batch_mark_closed
UPDATE conveyor_batches
SET state = %(state)s, counts = %(counts)s::jsonb, closings = closings + 1,
    finished_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND state = 'running'
RETURNING *

-- name: job_chain_append
-- Steps are added to the tail; refused once the flow service advanced the job.
UPDATE conveyor_jobs SET chain = coalesce(chain, '[]'::jsonb) || %(steps)s::jsonb
WHERE id = %(id)s AND chain_next IS NULL
RETURNING id

-- name: job_chain_due
SELECT id, state, result::text AS result, error, chain::text AS chain, chain_root
FROM conveyor_jobs
WHERE chain IS NOT NULL AND chain_next IS NULL AND state IN ('succeeded', 'failed', 'cancelled')
ORDER BY id
LIMIT %(limit)s

-- name: job_chain_link
-- 0 marks a chain that ended here (a failed or cancelled step).
UPDATE conveyor_jobs SET chain_next = %(next_id)s WHERE id = %(id)s AND chain_next IS NULL
RETURNING id

-- name: leader_attempt_elect
-- Take the lease if it is free or expired, renew it if it is ours.
INSERT INTO conveyor_leaders (name, holder, expires_at)
VALUES (%(name)s, %(holder)s, coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl_s)s))
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE conveyor_leaders.holder = excluded.holder
   OR conveyor_leaders.expires_at < coalesce(%(now)s::timestamptz, now())
RETURNING holder

-- name: leader_resign
DELETE FROM conveyor_leaders WHERE name = %(name)s AND holder = %(holder)s

-- name: job_request_cancel
-- A running job cannot be stopped from here: flag it, and its worker cancels it
-- at its next heartbeat (sooner: the NOTIFY wakes that heartbeat).
WITH flagged AS (
    UPDATE conveyor_jobs SET cancel_requested = true
    WHERE id = %(id)s AND state = 'running'
    RETURNING id
)
SELECT id, (SELECT count(*) FROM (SELECT pg_notify(%(channel)s, '@cancel') FROM flagged) n) AS notified
FROM flagged

-- name: worker_request_stop
WITH flagged AS (
    UPDATE conveyor_workers SET stop_requested = true WHERE id = %(id)s RETURNING id
)
SELECT id, (SELECT count(*) FROM (SELECT pg_notify(%(channel)s, '@cancel') FROM flagged) n) AS notified
FROM flagged

-- name: queue_set_paused
INSERT INTO conveyor_queues (name, paused, updated_at)
VALUES (%(name)s, %(paused)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at

-- name: queue_list
-- Every queue that has jobs or settings, with its counts per state.
SELECT coalesce(c.queue, q.name) AS name, coalesce(q.paused, false) AS paused,
       coalesce(c.counts, '{}'::jsonb)::text AS counts, q.max_running
FROM (SELECT queue, jsonb_object_agg(state, n) AS counts
      FROM (SELECT queue, state, count(*) AS n FROM conveyor_jobs GROUP BY queue, state) s
      GROUP BY queue) c
FULL JOIN conveyor_queues q ON q.name = c.queue
ORDER BY 1

-- name: job_age_priorities
-- Priority aging: a waiting job's priority is its base priority plus one per
-- aging_s seconds waited (capped at max_boost). The oldest first, a bounded
-- number per pass; SKIP LOCKED keeps it off rows being claimed.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), due AS (
    SELECT j.id,
           coalesce(j.base_priority, j.priority) AS base,
           coalesce(j.base_priority, j.priority)
             + least(%(max_boost)s, floor(extract(epoch FROM t.now - j.scheduled_at) / %(aging_s)s)::int)
             AS target
    FROM conveyor_jobs j, t
    WHERE j.state IN ('available', 'scheduled')
      AND j.scheduled_at <= t.now - make_interval(secs => %(aging_s)s)
    ORDER BY j.scheduled_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE conveyor_jobs j SET base_priority = due.base, priority = due.target
FROM due
WHERE j.id = due.id AND j.priority < due.target
RETURNING j.id

-- name: job_prune
-- Retention: finished jobs older than the cutoff, a small batch at a time, never
-- a job of an open batch or a chain link not yet advanced.
WITH doomed AS (
    SELECT j.id FROM conveyor_jobs j
    WHERE j.state = %(state)s
      AND j.finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than_s)s)
      AND NOT (j.chain IS NOT NULL AND j.chain_next IS NULL)
      AND NOT EXISTS (SELECT 1 FROM conveyor_batches b WHERE b.id = j.batch_id AND b.state = 'running')
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), attempts AS (
    DELETE FROM conveyor_attempts a USING doomed WHERE a.job_id = doomed.id
)
DELETE FROM conveyor_jobs j USING doomed WHERE j.id = doomed.id
RETURNING j.id

-- name: job_prune_count
SELECT count(*) AS n FROM conveyor_jobs j
WHERE j.state = %(state)s
  AND j.finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than_s)s)
  AND NOT (j.chain IS NOT NULL AND j.chain_next IS NULL)
  AND NOT EXISTS (SELECT 1 FROM conveyor_batches b WHERE b.id = j.batch_id AND b.state = 'running')

-- name: queue_limits
SELECT name, max_running, keyed, rate_per_s, rate_burst FROM conveyor_queues
WHERE name = ANY(%(queues)s::text[])

-- name: queue_set_limit
INSERT INTO conveyor_queues (name, max_running, updated_at)
VALUES (%(name)s, %(max_running)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running, updated_at = excluded.updated_at

-- name: queue_mark_keyed
INSERT INTO conveyor_queues (name, keyed, updated_at)
SELECT q, true, now() FROM unnest(%(queues)s::text[]) AS q
ON CONFLICT (name) DO UPDATE SET keyed = true WHERE NOT conveyor_queues.keyed

-- name: limits_lock
-- Claims that must respect a limit take this lock in a statement of their own:
-- in READ COMMITTED the claim statement that follows then has a snapshot taken
-- after the previous limited claim committed, so its counts are current.
SELECT pg_advisory_xact_lock(7262837502)

-- name: job_fetch_limited
-- One queue under limits: at most max_running running in the queue, and at most
-- concurrency_limit running per concurrency_key (across all queues). Candidates
-- are ranked per key; a candidate fits if its rank plus the key's running count
-- stays within the key's limit. A window of candidates is examined, so a queue
-- blocked by full keys still lets other keys through. Rate-limited jobs also need
-- a token: each bucket is refilled lazily here (min(burst, tokens + elapsed *
-- rate)) and a key gets at most floor(tokens) jobs; the backend spends them in the
-- same transaction (rate_spend).
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), cand AS (
    SELECT j.id, j.concurrency_key, j.concurrency_limit, j.rate_key, j.rate_per_s, j.rate_burst,
           j.spread_group, j.priority, j.scheduled_at
    FROM conveyor_jobs j, t
    WHERE j.queue = %(queue)s AND j.state IN ('available', 'scheduled') AND j.scheduled_at <= t.now
      AND NOT EXISTS (SELECT 1 FROM conveyor_queues p WHERE p.name = %(queue)s AND p.paused)
      -- pinned: one of the job's ids/tags must be this worker's id or one of its tags
      AND (j.pinned_to IS NULL OR j.pinned_to ?| %(identity)s::text[])
      -- spread: not if this worker runs, or has run, another job of the group
      AND (j.spread_group IS NULL OR NOT EXISTS (
               SELECT 1 FROM conveyor_jobs g
               WHERE g.spread_group = j.spread_group AND g.id <> j.id
                 AND (g.lease_owner = %(worker_id)s
                      OR EXISTS (SELECT 1 FROM conveyor_attempts a
                                 WHERE a.job_id = g.id AND a.worker_id = %(worker_id)s))))
    ORDER BY j.priority DESC, j.scheduled_at, j.id
    LIMIT %(window)s
    FOR UPDATE OF j SKIP LOCKED
), ranked AS MATERIALIZED (
    SELECT c.*,
           row_number() OVER (PARTITION BY c.concurrency_key
                              ORDER BY c.priority DESC, c.scheduled_at, c.id) AS rn,
           row_number() OVER (PARTITION BY c.rate_key
                              ORDER BY c.priority DESC, c.scheduled_at, c.id) AS rate_rn,
           row_number() OVER (PARTITION BY c.spread_group
                              ORDER BY c.priority DESC, c.scheduled_at, c.id) AS spread_rn
    FROM cand c
), busy AS MATERIALIZED (  -- once, not once per candidate (a nested loop did that)
    SELECT concurrency_key, count(*) AS n FROM conveyor_jobs
    WHERE state = 'running' AND concurrency_key IN (SELECT concurrency_key FROM cand)
    GROUP BY concurrency_key
), bucket AS MATERIALIZED (
    SELECT k.rate_key,
           least(k.burst, coalesce(b.tokens + extract(epoch FROM t.now - b.updated_at) * k.rate,
                                   k.burst)) AS tokens
    FROM (SELECT rate_key, max(rate_per_s) AS rate, max(rate_burst) AS burst FROM cand
          WHERE rate_key IS NOT NULL GROUP BY rate_key) k
    LEFT JOIN conveyor_rate_limits b ON b.key = k.rate_key, t
), queue_tokens AS (  -- the queue's own rate limit, if it has one
    SELECT floor(least(%(queue_burst)s::float8, coalesce(
               b.tokens + extract(epoch FROM t.now - b.updated_at) * %(queue_rate)s::float8,
               %(queue_burst)s::float8)))::bigint AS n
    FROM t LEFT JOIN conveyor_rate_limits b ON b.key = 'queue=' || %(queue)s
    WHERE %(queue_rate)s::float8 IS NOT NULL
), room AS (
    SELECT greatest(0, least(%(limit)s::bigint, coalesce(%(max_running)s::bigint - (
        SELECT count(*) FROM conveyor_jobs WHERE queue = %(queue)s AND state = 'running'),
        %(limit)s::bigint), coalesce((SELECT n FROM queue_tokens), %(limit)s::bigint))) AS n
), picked AS (
    SELECT r.id FROM ranked r
    LEFT JOIN busy b ON b.concurrency_key = r.concurrency_key
    LEFT JOIN bucket k ON k.rate_key = r.rate_key
    WHERE (r.concurrency_key IS NULL OR r.rn + coalesce(b.n, 0) <= r.concurrency_limit)
      AND (r.rate_key IS NULL OR r.rate_rn <= floor(k.tokens))
      AND (r.spread_group IS NULL OR r.spread_rn = 1)  -- one per group per claim
    ORDER BY r.priority DESC, r.scheduled_at, r.id
    LIMIT (SELECT n FROM room)
)
UPDATE conveyor_jobs j
SET state = 'running',
    attempt = j.attempt + 1,
    lease_owner = %(worker_id)s,
    lease_token = gen_random_uuid()::text,
    lease_expires_at = t.now + make_interval(secs => %(lease_s)s),
    started_at = t.now,
    error = NULL
FROM picked, t
WHERE j.id = picked.id
RETURNING j.id, j.queue, j.task, j.args::text AS args, j.state, j.priority, j.attempt,
          j.max_attempts, j.timeout_s, j.backoff::text AS backoff, j.stage, j.unique_key,
          j.idempotency_key, NULL::text AS result, j.error, j.lease_owner, j.lease_token,
          j.lease_expires_at, j.created_at, j.scheduled_at, j.started_at, j.finished_at,
          j.batch_id, j.context::text AS context, j.chain_root, j.concurrency_key,
          j.rate_key, j.rate_per_s, j.rate_burst

-- name: rate_spend
-- Take `taken` tokens from a bucket, refilling it first for the time elapsed.
INSERT INTO conveyor_rate_limits (key, tokens, updated_at)
VALUES (%(key)s, %(burst)s - %(taken)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (key) DO UPDATE
SET tokens = least(%(burst)s, conveyor_rate_limits.tokens
                   + extract(epoch FROM excluded.updated_at - conveyor_rate_limits.updated_at)
                     * %(rate)s) - %(taken)s,
    updated_at = excluded.updated_at

-- name: queue_set_rate
INSERT INTO conveyor_queues (name, rate_per_s, rate_burst, updated_at)
VALUES (%(name)s, %(rate_per_s)s, %(rate_burst)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO UPDATE SET rate_per_s = excluded.rate_per_s,
    rate_burst = excluded.rate_burst, updated_at = excluded.updated_at
