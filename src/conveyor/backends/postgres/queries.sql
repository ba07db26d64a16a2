-- PostgreSQL dialect. Parameters are psycopg's %(name)s, or %(name)b where arrays
-- are sent (binary arrays skip psycopg's per-element text escaping, the largest
-- client-side cost of a 1,000-row insert). A NULL %(now)s means the server's
-- clock, so every machine of a cluster agrees on lease expiry. Single statements
-- run in autocommit: no BEGIN/COMMIT round trips on the hot paths.

-- name: job_insert_many
-- One statement for the whole chunk: arrays in, unnest, one row per job.
-- WITH ORDINALITY + ORDER BY makes ids follow input order, which is how the
-- caller maps returned ids back to its inputs. ON CONFLICT DO NOTHING (no
-- target) covers both the unique_key and the idempotency_key indexes; the
-- backend drops that clause for chunks without keys (it costs ~10% of the
-- insert). The NOTIFY rides in the same statement and is delivered at commit,
-- so an enqueue rolled back with the caller's transaction wakes nobody.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), ins AS (
    INSERT INTO conveyor_jobs (queue, task, args, state, priority, max_attempts, timeout_s,
                               backoff, unique_key, idempotency_key, created_at, scheduled_at)
    SELECT i.queue, i.task, i.args,
           CASE WHEN i.delay_s > 0 THEN 'scheduled' ELSE 'available' END,
           i.priority, i.max_attempts, i.timeout_s, i.backoff, i.unique_key, i.idempotency_key,
           t.now, t.now + make_interval(secs => i.delay_s)
    FROM unnest(%(queue)b::text[], %(task)b::text[], %(args)b::text[]::jsonb[], %(priority)b::int[],
                %(max_attempts)b::int[], %(timeout_s)b::float8[], %(backoff)b::text[]::jsonb[],
                %(unique_key)b::text[], %(idempotency_key)b::text[], %(delay_s)b::float8[])
         WITH ORDINALITY AS i(queue, task, args, priority, max_attempts, timeout_s, backoff,
                              unique_key, idempotency_key, delay_s, ord),
         t
    ORDER BY i.ord
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
    FROM unnest(%(queues)b::text[]) AS q(name), t,
         LATERAL (
             SELECT id FROM conveyor_jobs
             WHERE queue = q.name
               AND state IN ('available', 'scheduled')
               AND scheduled_at <= t.now
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
          j.lease_expires_at, j.created_at, j.scheduled_at, j.started_at, j.finished_at

-- name: job_finalize_many
-- Fencing: a row is only touched while it is still running under the token the
-- outcome carries; the attempt is recorded for exactly the rows that were.
-- One worker writes one batch, so worker_id is a scalar; started_at is read
-- from the row rather than sent back.
WITH i AS (
    SELECT * FROM unnest(%(id)b::bigint[], %(token)b::text[], %(state)b::text[],
                         %(result)b::text[]::jsonb[], %(error)b::text[], %(traceback)b::text[],
                         %(retry_in_s)b::float8[], %(outcome)b::text[])
         AS i(id, token, state, result, error, traceback, retry_in_s, outcome)
), t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), done AS (
    UPDATE conveyor_jobs j
    SET state = i.state,
        result = i.result,
        error = i.error,
        scheduled_at = CASE WHEN i.state = 'scheduled'
                            THEN t.now + make_interval(secs => i.retry_in_s)
                            ELSE j.scheduled_at END,
        finished_at = CASE WHEN i.state IN ('succeeded', 'failed', 'cancelled') THEN t.now END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM i, t
    WHERE j.id = i.id AND j.lease_token = i.token AND j.state = 'running'
    RETURNING j.id, j.attempt, j.started_at
)
INSERT INTO conveyor_attempts (job_id, attempt, worker_id, started_at, finished_at, outcome, error, traceback)
SELECT done.id, done.attempt, %(worker_id)s, done.started_at, t.now, i.outcome, i.error, i.traceback
FROM done JOIN i ON i.id = done.id, t
RETURNING job_id

-- name: job_release_many
-- Graceful shutdown: give the job back and un-count the attempt it was on.
WITH released AS (
    UPDATE conveyor_jobs j
    SET state = 'available', attempt = greatest(j.attempt - 1, 0),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM unnest(%(id)b::bigint[], %(token)b::text[]) AS l(id, token)
    WHERE j.id = l.id AND j.lease_token = l.token AND j.state = 'running'
    RETURNING j.id, j.queue
), woken AS (
    SELECT pg_notify(%(channel)s, q) FROM (SELECT DISTINCT queue AS q FROM released) s
)
SELECT id, (SELECT count(*) FROM woken) AS notified FROM released

-- name: job_heartbeat
-- All of a worker's leases in one statement; rows missing from the result were
-- lost (rescued, or finished by someone else) and the worker must stop them.
UPDATE conveyor_jobs j
SET lease_expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_s)s)
FROM unnest(%(id)b::bigint[], %(token)b::text[]) AS l(id, token)
WHERE j.id = l.id AND j.lease_token = l.token AND j.state = 'running'
RETURNING j.id

-- name: worker_upsert
INSERT INTO conveyor_workers (id, hostname, pid, queues, concurrency, started_at, last_seen_at)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at

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
    RETURNING j.id, j.state, j.attempt, j.queue, j.error
), logged AS (
    INSERT INTO conveyor_attempts (job_id, attempt, worker_id, started_at, finished_at, outcome, error)
    SELECT m.id, m.attempt, e.lease_owner, e.started_at, t.now, 'lost', m.error
    FROM moved m JOIN expired e ON e.id = m.id, t
), woken AS (
    SELECT pg_notify(%(channel)s, q) FROM (SELECT DISTINCT queue AS q FROM moved WHERE state = 'available') s
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
