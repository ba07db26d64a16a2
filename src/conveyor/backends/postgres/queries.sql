-- PostgreSQL dialect. Parameters are psycopg's %(name)s, or %(name)b where arrays
-- are sent (binary arrays skip psycopg's per-element text escaping, the largest
-- client-side cost of a 1,000-row insert). A NULL %(now)s means the server's
-- clock, so every machine of a cluster agrees on lease expiry. Single statements
-- run in autocommit: no BEGIN/COMMIT round trips on the hot paths.
--
-- By id: an UPDATE of jobs picked by a CTE or sent as arrays also names their ids
-- as `j.id = ANY(...)`, an index condition on the primary key. Joined only to the
-- CTE, the plan depends on statistics: right after a table was emptied and
-- refilled (a new install, a bulk enqueue before autovacuum's next ANALYZE) the
-- planner believed the table nearly empty and walked all of it once per claim or
-- completion, 100 picked rows against every job (a claim of 100 from 3,000 jobs:
-- 119 ms instead of 7.6 ms; quadratic in the backlog). tests/backend/test_plans.py.
--
-- Live: the job table is partitioned by state (schema v17). A statement that
-- changes jobs still running or waiting says they are not finished (the macro UNFINISHED:
-- j.state NOT IN the finished states), a constant the planner prunes the finished
-- partitions by: otherwise it would be planned and
-- run over every day of finished jobs too (an index probe per partition and id).
-- NOT IN and not IN ('scheduled', 'available', 'running'): without statistics (a
-- live partition analyzed while empty) the planner takes an IN list to keep 1.5%
-- of the rows, and a NOT IN 98.5%; with 1 row expected from 100 ids it compared
-- each outcome with every other (tests/backend/test_plans.py). Nor state =
-- 'running': that matches a partial index, which a generic plan may then walk
-- instead of the ids.

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
           coalesce(i.spread_group, %(spread_group_all)s::text) AS spread_group,
           coalesce(i.tenant, %(tenant_all)s::text) AS tenant,
           coalesce(i.explicit, %(explicit_all)s::int) AS explicit
    FROM unnest(%(args)b::text[]::jsonb[], %(queue)b::text[], %(task)b::text[],
                %(priority)b::int[], %(max_attempts)b::int[], %(timeout_s)b::float8[],
                %(backoff)b::text[]::jsonb[], %(unique_key)b::text[],
                %(idempotency_key)b::text[], %(delay_s)b::float8[], %(batch_id)b::bigint[],
                %(stage)b::text[], %(context)b::text[]::jsonb[], %(chain)b::text[]::jsonb[],
                %(chain_root)b::bigint[], %(concurrency_key)b::text[], %(concurrency_limit)b::int[],
                %(rate_key)b::text[], %(rate_per_s)b::float8[], %(rate_burst)b::float8[],
                %(pinned_to)b::text[]::jsonb[], %(spread_group)b::text[], %(tenant)b::text[],
                %(explicit)b::int[])
         WITH ORDINALITY AS i(args, queue, task, priority, max_attempts, timeout_s, backoff,
                              unique_key, idempotency_key, delay_s, batch_id, stage, context,
                              chain, chain_root, concurrency_key, concurrency_limit, rate_key,
                              rate_per_s, rate_burst, pinned_to, spread_group, tenant, explicit,
                              ord)
), held AS (
    -- Idempotency keys a kept job holds, in any partition (schema v17: each
    -- partition's unique index covers its own jobs only). The lock keeps such a
    -- job where it is until this transaction ends; one that moved since this
    -- statement's snapshot fails it with a serialization error, and the backend
    -- runs it again (it then finds the job where it went).
    SELECT j.idempotency_key FROM conveyor_jobs j
    WHERE j.idempotency_key IN (SELECT v.idempotency_key FROM v)
    FOR KEY SHARE OF j
), ins AS (
    INSERT INTO conveyor_jobs (queue, task, args, state, priority, max_attempts, timeout_s,
                               backoff, unique_key, idempotency_key, batch_id, stage, context,
                               chain, chain_root, concurrency_key, concurrency_limit,
                               rate_key, rate_per_s, rate_burst, pinned_to, spread_group,
                               tenant, explicit, created_at, scheduled_at, changed)
    SELECT v.queue, v.task, v.args,
           CASE WHEN v.delay_s > 0 THEN 'scheduled' ELSE 'available' END,
           v.priority, v.max_attempts, v.timeout_s, v.backoff, v.unique_key, v.idempotency_key,
           v.batch_id, v.stage, v.context, v.chain, v.chain_root, v.concurrency_key,
           v.concurrency_limit, v.rate_key, v.rate_per_s, v.rate_burst, v.pinned_to,
           v.spread_group, v.tenant, v.explicit,
           t.now, t.now + make_interval(secs => v.delay_s), {CHANGE}
    FROM v, t
    WHERE v.idempotency_key IS NULL OR v.idempotency_key NOT IN (SELECT idempotency_key FROM held)
    ORDER BY v.ord
    ON CONFLICT DO NOTHING
    RETURNING id, unique_key, idempotency_key, state, queue
), woken AS (
    SELECT pg_notify(%(channel)s, q) FROM (SELECT DISTINCT queue AS q FROM ins WHERE state = 'available') s
)
SELECT id, unique_key, idempotency_key, (SELECT count(*) FROM woken) AS notified FROM ins

-- name: job_copy_begin
-- Bulk enqueue by COPY (job_insert_stream, and bulk inserts without keys): the
-- moment and the transaction's change stamp the rows are written with, and the
-- last job this transaction wrote before them (a caller's transaction may have).
-- COPY writes waiting jobs, so this, job_copy_span and job_copy_ids read the live
-- partition only ("Live" at the top): the stamp is not the partition key, and
-- over every day of finished jobs the planner probed each partition's change
-- index (a first call on a connection planned for 1.1 ms with 15 finished days,
-- 0.18 ms on the live partition). A job this transaction wrote and finished is
-- older than the COPY's rows, and not in the partition the span counts.
SELECT coalesce(%(now)s::timestamptz, now()) AS now, {CHANGE} AS change,
       coalesce((SELECT max(id) FROM conveyor_jobs j
                 WHERE j.changed = {CHANGE} AND {UNFINISHED(j)}), 0) AS after

-- name: job_copy
-- The jobs of a stream, as text rows (the backend formats them: keys, limits and
-- placement are never set on this path, so those columns keep their NULL
-- defaults; ids come from the column default, in row order).
COPY conveyor_jobs (args, queue, task, state, priority, max_attempts, timeout_s, backoff,
                    batch_id, stage, context, chain, chain_root, tenant, explicit,
                    created_at, scheduled_at, changed)
FROM STDIN

-- name: job_copy_now
-- job_copy for jobs that start now (no delay, the server's clock): created_at,
-- scheduled_at and the change stamp come from their column defaults (schema v18),
-- which the server does not have to parse on every row.
COPY conveyor_jobs (args, queue, task, state, priority, max_attempts, timeout_s, backoff,
                    batch_id, stage, context, chain, chain_root, tenant, explicit)
FROM STDIN

-- name: job_copy_delays
-- After job_copy_now, the rare job of the stream that does not start now: its
-- due time (its row says 'scheduled' already).
UPDATE conveyor_jobs j SET scheduled_at = j.created_at + make_interval(secs => d.delay_s)
FROM unnest(%(ids)s::bigint[], %(delays)s::float8[]) AS d(id, delay_s)
WHERE j.id = d.id AND j.id = ANY(%(ids)s::bigint[])  -- (see "By id" at the top)
  AND {UNFINISHED(j)}  -- (see "Live" at the top)

-- name: job_copy_span
-- How many rows COPY wrote (the rows this transaction stamped since
-- job_copy_begin) and their first and last ids: one row to read. When there are
-- as many as the span holds, the ids are that range, in row order (each row took
-- the next id); a COPY that shared the id sequence with another writer has gaps,
-- and its ids are read one by one (job_copy_ids).
SELECT count(*) AS n, min(id) AS first, max(id) AS last
FROM conveyor_jobs j WHERE j.changed = %(change)s::xid8 AND j.id > %(after)s AND {UNFINISHED(j)}

-- name: job_copy_ids
-- The ids COPY gave, in row order: the rows this transaction stamped since
-- job_copy_begin (the change index holds them in id order).
SELECT j.id FROM conveyor_jobs j
WHERE j.changed = %(change)s::xid8 AND j.id > %(after)s AND {UNFINISHED(j)}
ORDER BY j.id

-- name: job_drop_taken_keys
-- Jobs just inserted whose idempotency key another job holds after all: one whose
-- insert committed after this transaction's insert statement took its snapshot, and
-- that finished before the insert reached the live partition's unique index (each
-- partition's index covers its own jobs only, schema v17; the held CTE of
-- job_insert_many sees only its snapshot). This statement takes a snapshot of its
-- own (READ COMMITTED), so it sees that job; ours goes, and the caller finds the
-- other by its key. Such a job finished after this transaction began (it was
-- claimed after its insert, which committed after ours took its snapshot): only
-- the jobs finished since now() are read, through the finished index, instead of
-- probing every day's key index per job (which doubled a keyed send_many of 1,000).
-- tests/backend/test_partitions.py races the two.
DELETE FROM conveyor_jobs n
WHERE n.id = ANY(%(ids)s::bigint[]) AND {UNFINISHED(n)}
  AND n.idempotency_key IN (
      SELECT o.idempotency_key FROM conveyor_jobs o
      WHERE o.state IN ('succeeded', 'failed', 'cancelled') AND o.finished_at >= now()
        AND o.idempotency_key IS NOT NULL)
RETURNING n.id

-- name: job_insert_one
-- One job without keys (a plain send): scalars instead of arrays, no unnest and
-- no coalesce, so less for psycopg to encode and the server to run (a send: 360
-- -> 310 us through the backend). The same columns and values as
-- job_insert_many; tests/backend/test_jobs.py compares the two.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), ins AS (
    INSERT INTO conveyor_jobs (queue, task, args, state, priority, max_attempts, timeout_s,
                               backoff, unique_key, idempotency_key, batch_id, stage, context,
                               chain, chain_root, concurrency_key, concurrency_limit,
                               rate_key, rate_per_s, rate_burst, pinned_to, spread_group,
                               tenant, explicit, created_at, scheduled_at, changed)
    SELECT %(queue)s, %(task)s, %(args_json)s::jsonb,
           CASE WHEN %(delay_s)s::float8 > 0 THEN 'scheduled' ELSE 'available' END,
           %(priority)s, %(max_attempts)s, %(timeout_s)s::float8, %(backoff_json)s::jsonb,
           %(unique_key)s, %(idempotency_key)s, %(batch_id)s::bigint, %(stage)s,
           %(context_json)s::jsonb, %(chain_json)s::jsonb, %(chain_root)s::bigint,
           %(concurrency_key)s, %(concurrency_limit)s::int, %(rate_key)s,
           %(rate_per_s)s::float8, %(rate_burst)s::float8, %(pinned_to)s::jsonb,
           %(spread_group)s, %(tenant)s, %(explicit)s,
           t.now, t.now + make_interval(secs => %(delay_s)s::float8), pg_current_xact_id()
    FROM t
    RETURNING id, unique_key, idempotency_key, state, queue
), woken AS (
    SELECT pg_notify(%(channel)s, queue) FROM ins WHERE state = 'available'
)
SELECT id, unique_key, idempotency_key, (SELECT count(*) FROM woken) AS notified FROM ins

-- fragment: running_per_key
-- Running jobs per key of a CTE `cand` (its column concurrency_key), counted once,
-- as one {key: n} object (job_claim_limited, job_claim_keyed): the planner, with
-- no statistics on a CTE, joined it to the candidates by a nested loop (1,000 x 100
-- comparisons, 9 of a claim's 14 ms); a lookup is one probe.
SELECT coalesce(jsonb_object_agg(k.concurrency_key, k.n), '{}') AS n FROM (
    -- Each of the candidates' keys, once, probes the running-key index (v15) for
    -- its running jobs. A join of that index with the candidates was planned by
    -- their estimates: a CTE and a parameter array are guesses, the running jobs
    -- "1 row" to a generic plan, and inside the limited claim's function the join
    -- became a nested loop that compared every running job with every candidate
    -- (100 x 100: 1.1 of a keyed claim's 4 ms, 100 running; hashed, 0.2). A probe
    -- per key has no join to plan: one key's entries, however many keys run.
    SELECT c.concurrency_key,
           (SELECT count(*) FROM conveyor_jobs r
            WHERE r.state = 'running' AND r.concurrency_key = c.concurrency_key) AS n
    FROM (SELECT DISTINCT concurrency_key FROM cand WHERE concurrency_key IS NOT NULL) c) k
WHERE k.n > 0

-- fragment: job_claimed
-- The end of both claims (job_claim, job_claim_limited): the jobs a CTE `picked`
-- chose, at the time of a CTE `t`, become the worker's, and come back as a claim
-- returns them.
UPDATE conveyor_jobs j
SET state = 'running',
    attempt = j.attempt + 1,
    lease_owner = %(worker_id)s,
    lease_token = gen_random_uuid()::text,
    lease_expires_at = t.now + make_interval(secs => %(lease_s)s::float8),
    started_at = t.now,
    error = NULL,
    changed = {CHANGE}
FROM t
WHERE j.id = ANY(ARRAY(SELECT id FROM picked))  -- (see "By id" at the top)
  -- (see "Live" at the top)
  AND {UNFINISHED(j)}
RETURNING j.id, j.queue, j.task, j.args::text AS args, j.state, j.priority, j.attempt,
          j.max_attempts, j.timeout_s, j.backoff::text AS backoff, j.stage, j.unique_key,
          j.idempotency_key, j.lease_owner, j.lease_token, j.lease_expires_at, j.created_at,
          j.scheduled_at, j.started_at, j.finished_at, j.batch_id, j.context::text AS context,
          j.chain_root, j.tenant, j.base_priority, j.concurrency_key, j.rate_key, j.rate_per_s,
          j.rate_burst, j.pinned_to::text AS pinned_to

-- name: job_claim
-- Claim: SKIP LOCKED lets many workers claim concurrently without waiting on
-- one another. One LATERAL probe per queue keeps each an ordered walk of the
-- fetch index (queue = ANY(...) with ORDER BY would sort every claimable row on
-- PG 15); the outer LIMIT stops pulling, and locking, once enough are found.
-- The worker rotates the queue order between claims so no queue starves.
-- Due scheduled jobs are claimable directly: a retry or delay does not wait for
-- the scheduler's next pass. A worker takes only tasks it has handlers for
-- (%(tasks)s; NULL: any). A claim from code older than the schema takes nothing
-- (newer rules, say pinning, must not be bypassed during a rolling upgrade).
-- The job is the worker's while the worker heartbeats; lease_s, when given,
-- is a deadline of its own (clients that hold jobs without heartbeating).
-- JSON columns come back as text: the backend decodes them itself.
-- A claim commits without waiting for its WAL to reach the disk (synchronous_commit
-- off for this transaction only): the handler starts one fsync sooner (about 0.25
-- ms of an idle worker's 3 ms). A claim lost to a server crash leaves the job
-- available, as a worker that died after claiming would, and the worker's later
-- heartbeat or outcome is refused: at-least-once, as before. Any durable commit
-- after it (an outcome, an enqueue) flushes it too: the WAL is one sequence.
-- But not where a synchronous standby is configured: there a claim commits as
-- everything else does (waits for the standby), or a failover to that standby
-- would lose claims whose handlers already ran, and run them a second time.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now,
           set_config('synchronous_commit', {CLAIM_COMMIT}, true) AS async_commit
), picked AS (
    SELECT c.id
    FROM (SELECT name FROM unnest(%(queues)b::text[]) AS u(name)
          WHERE NOT EXISTS (SELECT 1 FROM conveyor_queues p WHERE p.name = u.name AND p.paused)
            AND (SELECT max(version) FROM conveyor_schema_version) <= %(schema_version)s
         ) AS q, t,
         LATERAL (
             SELECT id FROM conveyor_jobs
             WHERE queue = q.name
               AND state IN ('available', 'scheduled')
               AND scheduled_at <= t.now
               AND concurrency_key IS NULL AND rate_key IS NULL  -- those, and placed jobs:
               AND pinned_to IS NULL AND spread_group IS NULL    -- job_claim_limited
               AND (%(tasks)s::text[] IS NULL OR task = ANY(%(tasks)s::text[]))
             ORDER BY priority DESC, scheduled_at, id
             LIMIT %(limit)s
             FOR UPDATE SKIP LOCKED
         ) c
    LIMIT %(limit)s
)
-- (pinned_to comes back as from job_claim_limited, NULL here: pinned jobs are its)
{FRAGMENT(job_claimed)}

-- name: job_finalize_many
-- Fencing: a row is only touched while it is still running under the token the
-- outcome carries; the attempt is recorded for exactly the rows that were (a
-- success by the job row itself, which keeps its worker in lease_owner).
-- Columns the same for the whole batch of outcomes travel as scalars (see
-- job_insert_many). Outcome "stage" moves the job to its next stage with a
-- fresh attempt count. Jobs that became available wake workers of their queue;
-- finished jobs of a batch or chain wake the flow service ("@flow"); any
-- finished job hints waiters on the events channel. A cancel request ends with
-- the run it was for; a job whose cancel was requested ends cancelled unless it
-- failed, whatever its handler returned (its worker had not seen the request
-- yet). An error classifier may allow more attempts (max_attempts).
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
           coalesce(u.priority, %(priority_all)s::int) AS priority,
           coalesce(u.max_attempts, %(max_attempts_all)s::int) AS max_attempts
    FROM unnest(%(id)b::bigint[], %(token)b::text[], %(state)b::text[], %(outcome)b::text[],
                %(result_json)b::text[]::jsonb[], %(error)b::text[], %(traceback)b::text[],
                %(retry_in_s)b::float8[], %(ran_attempt)b::int[], %(ran_stage)b::text[],
                %(next_stage)b::text[], %(context_json)b::text[]::jsonb[], %(priority)b::int[],
                %(max_attempts)b::int[])
         AS u(id, token, state, outcome, result, error, traceback, retry_in_s, ran_attempt,
              ran_stage, next_stage, context, priority, max_attempts)
), t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), done AS (
    UPDATE conveyor_jobs j
    SET state = CASE WHEN j.cancel_requested AND i.state <> 'failed' THEN 'cancelled'
                     ELSE i.state END,
        result = i.result,
        error = CASE WHEN j.cancel_requested AND i.state NOT IN ('failed', 'cancelled')
                     THEN 'cancelled while running (it finished before its worker learned)'
                     ELSE i.error END,
        scheduled_at = CASE WHEN i.state = 'scheduled'
                            THEN t.now + make_interval(secs => coalesce(i.retry_in_s, 0))
                            WHEN i.outcome = 'stage' THEN t.now
                            ELSE j.scheduled_at END,
        finished_at = CASE WHEN i.state IN ('succeeded', 'failed', 'cancelled')
                             OR j.cancel_requested THEN t.now END,
        stage = CASE WHEN i.outcome = 'stage' AND NOT j.cancel_requested THEN i.next_stage
                     ELSE j.stage END,
        context = CASE WHEN i.outcome = 'stage' AND NOT j.cancel_requested THEN i.context
                       ELSE j.context END,
        attempt = CASE WHEN i.outcome = 'stage' THEN 0
                       WHEN i.outcome = 'snoozed' THEN greatest(j.attempt - 1, 0)
                       ELSE j.attempt END,
        priority = coalesce(i.priority, j.priority),
        max_attempts = coalesce(i.max_attempts, j.max_attempts),
        cancel_requested = false,
        -- a success records its worker: its attempt is read from the job row (v12)
        lease_owner = CASE WHEN i.state = 'succeeded' AND NOT j.cancel_requested
                           THEN %(worker_id)s END,
        lease_token = NULL, lease_expires_at = NULL,
        changed = {CHANGE}
    FROM i, t
    -- A lease token is non-null only while the job runs (claims set it, every way
    -- out of 'running' clears it), so id + token is the whole fence. Not also
    -- "state = 'running'": that matches the partial lease index, and a generic
    -- plan after an ANALYZE that saw no running jobs then nested-loops over them.
    WHERE j.id = i.id AND j.lease_token = i.token AND j.id = ANY(%(id)b::bigint[])  -- (see "By id" at the top)
      -- (see "Live" at the top)
      AND {UNFINISHED(j)}
    RETURNING j.id, j.queue, j.state, j.attempt, j.started_at, j.error,
              (j.batch_id IS NOT NULL OR j.chain IS NOT NULL) AS flow
), woken AS (
    -- Queue hints name this worker (chr(31), interfaces.sent_by): it claims again
    -- after this write anyway, so it skips them; other workers take them.
    SELECT pg_notify(%(channel)s, h) FROM (
        SELECT DISTINCT queue || chr(31) || %(worker_id)s AS h FROM done
        WHERE state = 'available'
        UNION
        -- a job leaving 'running' in a limited queue makes room: wake its workers
        SELECT DISTINCT d.queue || chr(31) || %(worker_id)s FROM done d
        WHERE EXISTS (SELECT 1 FROM conveyor_queues q
                      WHERE q.name = d.queue AND (q.max_running IS NOT NULL OR q.keyed))
        UNION
        SELECT '@flow' FROM done WHERE flow AND state IN ('succeeded', 'failed', 'cancelled')
    ) s
), hinted AS (
    SELECT pg_notify(%(events)s, 'done')
    WHERE EXISTS (SELECT 1 FROM done WHERE state IN ('succeeded', 'failed', 'cancelled'))
), logged AS (
    INSERT INTO conveyor_attempts (job_id, attempt, stage, worker_id, started_at, finished_at,
                                   outcome, error, traceback)
    SELECT done.id, coalesce(i.ran_attempt, done.attempt), i.ran_stage, %(worker_id)s,
           done.started_at, t.now,
           CASE WHEN done.state = 'cancelled' THEN 'cancelled' ELSE i.outcome END,
           CASE WHEN done.state = 'cancelled' AND i.state <> 'cancelled' THEN done.error
                ELSE i.error END,
           i.traceback
    FROM done JOIN i ON i.id = done.id, t
    -- a success writes no attempt row: the job row says it all (schema v12)
    WHERE done.state <> 'succeeded'
    RETURNING job_id
)
SELECT id AS job_id,
       (SELECT count(*) FROM woken) + (SELECT count(*) FROM hinted)
       + (SELECT count(*) FROM logged) AS notified
FROM done

-- name: job_release_many
-- Graceful shutdown: give the job back and un-count the attempt it was on; the
-- attempt log keeps a "released" line, so the interrupted run leaves a trace.
WITH released AS (
    UPDATE conveyor_jobs j
    SET state = 'available', attempt = greatest(j.attempt - 1, 0),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        cancel_requested = false, changed = {CHANGE}
    FROM unnest(%(id)b::bigint[], %(token)b::text[]) AS l(id, token)
    WHERE j.id = l.id AND j.lease_token = l.token  -- the token fences (see job_finalize_many)
      AND j.id = ANY(%(id)b::bigint[])  -- (see "By id" at the top)
      -- (see "Live" at the top)
      AND {UNFINISHED(j)}
    RETURNING j.id, j.queue, j.attempt + 1 AS ran, j.stage, j.started_at
), logged AS (
    INSERT INTO conveyor_attempts (job_id, attempt, stage, worker_id, started_at, finished_at,
                                   outcome, error)
    SELECT id, ran, stage, %(worker_id)s, started_at, coalesce(%(now)s::timestamptz, now()),
           'released', 'released by its worker; the attempt does not count'
    FROM released
), woken AS (
    SELECT pg_notify(%(channel)s, q) FROM (SELECT DISTINCT queue AS q FROM released) s
)
SELECT id, (SELECT count(*) FROM woken) AS notified FROM released

-- name: worker_heartbeat
-- One row written per heartbeat, however many jobs the worker runs: a job is
-- the worker's as long as the worker is alive (job_rescue). The same statement
-- reads back what the worker holds (a job missing, or under another token, was
-- lost: rescued after the worker was judged dead, or finished elsewhere), which
-- of its jobs an operator wants cancelled, whether it should stop, and the
-- schema version (a newer one: this code must stop claiming). "inserted" says
-- the row had been removed (judged dead long ago and pruned).
WITH me AS (
    INSERT INTO conveyor_workers (id, hostname, pid, queues, concurrency, tags, tasks,
                                  started_at, last_seen_at)
    VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s, %(tags)s,
            %(tasks)s::jsonb, coalesce(%(now)s::timestamptz, now()),
            coalesce(%(now)s::timestamptz, now()))
    ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at
    RETURNING stop_requested, (xmax = 0) AS inserted
)
SELECT me.stop_requested, me.inserted,
       (SELECT max(version) FROM conveyor_schema_version) AS schema_version,
       (SELECT coalesce(json_agg(json_build_array(id, lease_token, cancel_requested)), '[]')::text
        FROM conveyor_jobs WHERE lease_owner = %(id)s AND state = 'running') AS held
FROM me

-- name: job_rescue
-- Running jobs whose worker went silent (no heartbeat for worker_ttl_s: crashed,
-- hung, cut off) or was removed, and held jobs past their own deadline. Jobs of a
-- live worker are never rescued, however long they run. The attempt a rescued
-- job was on still counts, so a job that kills its worker every time ends
-- failed after max_attempts instead of looping forever.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), expired AS (
    SELECT j.id, j.lease_owner, j.started_at,
           CASE WHEN j.lease_expires_at < t.now THEN 'was held past its deadline'
                ELSE 'stopped heartbeating' END AS why
    FROM conveyor_jobs j, t
    WHERE j.state = 'running'
      AND (j.lease_expires_at < t.now
           OR (j.lease_expires_at IS NULL AND NOT EXISTS (
                   SELECT 1 FROM conveyor_workers w
                   WHERE w.id = j.lease_owner
                     AND w.last_seen_at >= t.now - make_interval(secs => %(worker_ttl_s)s))))
    -- No ORDER BY: ordered by id, a planner that took the table for nearly empty
    -- walked the primary key over every job; unordered, it reads the running
    -- jobs through their partial index whatever the statistics say.
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), moved AS (
    UPDATE conveyor_jobs j
    SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'failed' ELSE 'available' END,
        error = format('lease lost on attempt %%s of %%s (worker %%s %%s); %%s',
                       j.attempt, j.max_attempts, e.lease_owner, e.why,
                       CASE WHEN j.attempt >= j.max_attempts THEN 'no attempts left, giving up'
                            ELSE 'requeued' END),
        finished_at = CASE WHEN j.attempt >= j.max_attempts THEN t.now END,
        cancel_requested = false,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        changed = {CHANGE}
    FROM expired e, t
    WHERE j.id = e.id AND j.id = ANY(ARRAY(SELECT id FROM expired))  -- (see "By id" at the top)
      -- (see "Live" at the top)
      AND {UNFINISHED(j)}
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
), hinted AS (
    SELECT pg_notify(%(events)s, 'done') WHERE EXISTS (SELECT 1 FROM moved WHERE state = 'failed')
)
SELECT id, state, (SELECT count(*) FROM woken) + (SELECT count(*) FROM hinted) AS notified
FROM moved

-- name: job_schedule_due
-- Due scheduled jobs become available (claims also take due scheduled jobs
-- directly; this keeps counts and views honest). The backend wakes their queues.
WITH due AS (
    SELECT id FROM conveyor_jobs
    WHERE state = 'scheduled' AND scheduled_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY scheduled_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE conveyor_jobs j SET state = 'available', changed = {CHANGE}
WHERE j.id = ANY(ARRAY(SELECT id FROM due))  -- (see "By id" at the top)
  -- (see "Live" at the top)
  AND {UNFINISHED(j)}
RETURNING j.queue

-- name: schema_version_table
CREATE TABLE IF NOT EXISTS conveyor_schema_version (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: schema_version_exists
SELECT to_regclass('conveyor_schema_version') IS NOT NULL AS present

-- name: migration_lock
-- Two processes migrating at once: the second waits, then finds nothing to do.
SELECT pg_advisory_xact_lock(7262837501)

-- name: queue_list
-- Every queue that has jobs (from the count rollup) or settings, with its counts.
SELECT coalesce(c.queue, q.name) AS name, coalesce(q.paused, false) AS paused,
       coalesce(c.counts, '{}'::jsonb)::text AS counts, q.max_running, q.rate_per_s,
       q.rate_burst
FROM (SELECT queue, jsonb_object_agg(state, n) AS counts
      FROM (SELECT queue, state, sum(n) AS n FROM (
                SELECT queue, state, n FROM conveyor_counts
                UNION ALL
                SELECT queue, state, n FROM conveyor_count_deltas) x
            GROUP BY queue, state HAVING sum(n) <> 0) s
      GROUP BY queue) c
FULL JOIN conveyor_queues q ON q.name = c.queue
ORDER BY 1

-- name: job_age_priorities
-- Priority aging: a waiting job's priority is its base priority plus one per
-- aging_s seconds waited (capped at max_boost). A job's priority changes only as
-- its age crosses a multiple of aging_s, so a pass reads only the jobs whose age
-- crossed one in the last window_s seconds: max_boost narrow ranges per queue, each
-- an index range of the waiting index. With no window (a new leader's first pass)
-- it reads every waiting job old enough, a bounded number per statement; jobs
-- already at their target are never picked, so repeated statements progress.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), q AS (
    SELECT queue FROM conveyor_counts WHERE state = 'available' AND n > 0
    UNION
    SELECT queue FROM conveyor_count_deltas WHERE state = 'available'
), w AS (
    SELECT t.now - make_interval(secs => k * %(aging_s)s) AS hi,
           t.now - make_interval(secs => k * %(aging_s)s + %(window_s)s) AS lo
    FROM t, generate_series(1, %(max_boost)s) AS k
    WHERE %(window_s)s::float8 IS NOT NULL
    UNION ALL
    SELECT t.now - make_interval(secs => %(aging_s)s), '-infinity'::timestamptz
    FROM t WHERE %(window_s)s::float8 IS NULL
), due AS (
    SELECT c.id, c.base, c.target
    FROM q, w, t,
         LATERAL (
             SELECT j.id, coalesce(j.base_priority, j.priority) AS base,
                    coalesce(j.base_priority, j.priority)
                      + least(%(max_boost)s,
                              floor(extract(epoch FROM t.now - j.scheduled_at) / %(aging_s)s)::int)
                      AS target
             FROM conveyor_jobs j
             WHERE j.queue = q.queue AND j.state = 'available'
               AND j.scheduled_at <= w.hi AND j.scheduled_at > w.lo
               AND j.priority < coalesce(j.base_priority, j.priority)
                      + least(%(max_boost)s,
                              floor(extract(epoch FROM t.now - j.scheduled_at) / %(aging_s)s)::int)
             ORDER BY j.scheduled_at, j.id
             LIMIT %(limit)s
             FOR UPDATE OF j SKIP LOCKED
         ) c
    LIMIT %(limit)s
)
UPDATE conveyor_jobs j SET base_priority = due.base, priority = due.target
FROM due
WHERE j.id = due.id AND j.id = ANY(ARRAY(SELECT id FROM due))  -- (see "By id" at the top)
  -- (see "Live" at the top)
  AND {UNFINISHED(j)}
RETURNING j.id

-- name: queue_mark_keyed
INSERT INTO conveyor_queues (name, keyed, updated_at)
SELECT q, true, now() FROM unnest(%(queues)s::text[]) AS q
ON CONFLICT (name) DO UPDATE SET keyed = true WHERE NOT conveyor_queues.keyed

-- name: limits_lock
-- Claims that must respect a queue's limit (max_running or its own rate) take this
-- lock, one per queue (claims in other queues never wait on it), in a statement of
-- their own: in READ COMMITTED the statements that follow then have snapshots
-- taken after the previous limited claim of this queue committed, so the queue's
-- counts are current. A queue limited only by its jobs' keys takes no queue lock:
-- its claims serialise per key instead (job_claim_candidates).
-- No bitmap scans in the transaction: a queue's running jobs are counted through
-- a partial index on state = 'running' that keeps an entry for every job that ran
-- since the last VACUUM, and only a plain index scan marks the dead ones so the
-- next count skips them (a bitmap scan visited them all again: 0.8 ms a claim
-- late in a drain of 20,000 jobs, 3,033 entries for 0 running; 0.04 ms after).
SELECT CASE WHEN %(queue_lock)s THEN pg_advisory_xact_lock(72628374, hashtext(%(queue)s)) END,
       set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('synchronous_commit', {CLAIM_COMMIT}, true)  -- a claim: see job_claim

-- name: queue_running
-- Running jobs in one queue (under the queue's lock: current), by the state index.
SELECT count(*) AS n FROM conveyor_jobs WHERE queue = %(queue)s AND state = 'running'

-- name: job_claim_candidates
-- A limited claim's candidates, locked (SKIP LOCKED: claims never wait on each
-- other's rows), and locks on their keys. Concurrency and rate keys are shared by
-- queues, so two claims whose candidates share a key must not count that key's
-- running jobs or spend its tokens at the same time: each tries a transaction
-- advisory lock per key (by the key's hash) without waiting, and a key another
-- claim holds is left out of this claim, as SKIP LOCKED leaves rows out. Claims
-- never wait on each other's keys, and cannot deadlock. The claim that counts
-- comes next (job_claim_limited), in a statement of its own: in READ COMMITTED
-- its snapshot is taken after these locks were ours, so it sees every claim of
-- these keys that committed before. The server's lock table is shared by the
-- cluster, so a claim locks at most KEY_LOCKS_MAX (128) keys, the first in claim
-- order; candidates of further keys are left to a later claim too.
WITH cand AS MATERIALIZED (
    SELECT j.id, j.concurrency_key, j.rate_key, j.concurrency_limit, j.spread_group
    -- Not joined to t: beside a one-row CTE the planner no longer knew the index
    -- scan's order and sorted every waiting job of the queue per claim (12,100 of
    -- them, 6 ms of a 11 ms claim); alone, the scan walks the fetch index in
    -- order and stops after the window.
    FROM conveyor_jobs j
    WHERE j.queue = %(queue)s AND j.state IN ('available', 'scheduled')
      AND j.scheduled_at <= coalesce(%(now)s::timestamptz, now())
      AND NOT EXISTS (SELECT 1 FROM conveyor_queues p WHERE p.name = %(queue)s AND p.paused)
      AND (SELECT max(version) FROM conveyor_schema_version) <= %(schema_version)s
      AND (%(tasks)s::text[] IS NULL OR j.task = ANY(%(tasks)s::text[]))
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
), ordered AS MATERIALIZED (
    SELECT cand.*, row_number() OVER () AS ord FROM cand  -- in claim order
), keys AS MATERIALIZED (
    SELECT k.key FROM ordered o, LATERAL (VALUES (o.concurrency_key), (o.rate_key)) AS k(key)
    WHERE k.key IS NOT NULL
    GROUP BY k.key
    ORDER BY min(o.ord)
    LIMIT %(key_locks)s  -- KEY_LOCKS_MAX (128)
), locked AS MATERIALIZED (
    -- the job table's oid in the hash: apps in other schemas of the database
    -- (advisory locks are the database's) never hold this app's keys
    SELECT key FROM keys
    WHERE pg_try_advisory_xact_lock(
              72628375, hashtext('conveyor_jobs'::regclass::oid::text || '/' || key))
)
SELECT o.id, o.rate_key, o.concurrency_key, o.concurrency_limit, o.spread_group, o.ord
FROM ordered o
WHERE (o.concurrency_key IS NULL OR o.concurrency_key IN (SELECT key FROM locked))
  AND (o.rate_key IS NULL OR o.rate_key IN (SELECT key FROM locked))

-- name: job_claim_limited
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
    -- The candidates job_claim_candidates locked (by id; see "By id" at the top).
    SELECT j.id, j.concurrency_key, j.concurrency_limit, j.rate_key, j.rate_per_s, j.rate_burst,
           j.spread_group, j.priority, j.scheduled_at
    FROM conveyor_jobs j
    WHERE j.id = ANY(%(ids)s::bigint[])
      AND {UNFINISHED(j)}  -- (see "Live" at the top: the finished days are not read)
), ranked AS MATERIALIZED (
    SELECT c.*,
           row_number() OVER (PARTITION BY c.concurrency_key
                              ORDER BY c.priority DESC, c.scheduled_at, c.id) AS rn,
           row_number() OVER (PARTITION BY c.rate_key
                              ORDER BY c.priority DESC, c.scheduled_at, c.id) AS rate_rn,
           row_number() OVER (PARTITION BY c.spread_group
                              ORDER BY c.priority DESC, c.scheduled_at, c.id) AS spread_rn
    FROM cand c
), busy AS MATERIALIZED (
    {FRAGMENT(running_per_key)}
    -- (bucket: tokens per rate key, {key: tokens}, likewise)
), bucket AS MATERIALIZED (
    SELECT coalesce(jsonb_object_agg(k.rate_key, least(k.burst, coalesce(
               b.tokens + extract(epoch FROM t.now - b.updated_at) * k.rate, k.burst))),
               '{}') AS tokens
    FROM (SELECT rate_key, max(rate_per_s) AS rate, max(rate_burst) AS burst FROM cand
          WHERE rate_key IS NOT NULL GROUP BY rate_key) k
    LEFT JOIN conveyor_rate_limits b ON b.key = k.rate_key, t
    -- (queue_tokens: the queue's own rate limit, if it has one)
), queue_tokens AS (
    SELECT floor(least(%(queue_burst)s::float8, coalesce(
               b.tokens + extract(epoch FROM t.now - b.updated_at) * %(queue_rate)s::float8,
               %(queue_burst)s::float8)))::bigint AS n
    FROM t LEFT JOIN conveyor_rate_limits b ON b.key = 'queue=' || %(queue)s
    WHERE %(queue_rate)s::float8 IS NOT NULL
), room AS (
    -- The queue's running jobs are counted only under a queue limit: NULL minus a
    -- count still ran the count (0.24 ms a claim through the running index's
    -- entries of every job run since the last VACUUM).
    SELECT greatest(0, least(%(limit)s::bigint,
        CASE WHEN %(max_running)s::bigint IS NULL THEN %(limit)s::bigint
             ELSE %(max_running)s::bigint - (
                 SELECT count(*) FROM conveyor_jobs WHERE queue = %(queue)s AND state = 'running')
        END, coalesce((SELECT n FROM queue_tokens), %(limit)s::bigint))) AS n
), picked AS (
    SELECT r.id FROM ranked r, busy b, bucket k
    WHERE (r.concurrency_key IS NULL
           OR r.rn + coalesce((b.n ->> r.concurrency_key)::bigint, 0) <= r.concurrency_limit)
      AND (r.rate_key IS NULL OR r.rate_rn <= floor((k.tokens ->> r.rate_key)::float8))
      -- one per group per claim
      AND (r.spread_group IS NULL OR r.spread_rn = 1)
    ORDER BY r.priority DESC, r.scheduled_at, r.id
    LIMIT (SELECT n FROM room)
)
{FRAGMENT(job_claimed)}

-- name: job_claim_keyed
-- job_claim_limited where nothing but the jobs' concurrency keys limits the claim
-- (no queue limit or rate, no rate key or spread group among the candidates), the
-- common keyed claim: the candidates come as job_claim_candidates returned them,
-- their keys and limits as arrays (%(ords)s: their claim order), so they are not
-- read again by id, and ranked once, per key, in claim order (job_claim_limited
-- read them again and ranked them three times: per concurrency key, rate key and
-- spread group). The count that decides is the same, in a statement of its own.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), cand AS MATERIALIZED (
    SELECT c.id, c.concurrency_key, c.lim, c.ord,
           row_number() OVER (PARTITION BY c.concurrency_key ORDER BY c.ord) AS rn
    FROM unnest(%(ids)s::bigint[], %(keys)s::text[], %(limits)s::int[], %(ords)s::bigint[])
         AS c(id, concurrency_key, lim, ord)
), busy AS MATERIALIZED (
    {FRAGMENT(running_per_key)}
), picked AS (
    SELECT c.id FROM cand c, busy b
    WHERE c.concurrency_key IS NULL
       OR c.rn + coalesce((b.n ->> c.concurrency_key)::bigint, 0) <= c.lim
    ORDER BY c.ord
    LIMIT %(limit)s
)
{FRAGMENT(job_claimed)}

-- name: job_claim_limited_function
-- A limited claim in one round trip (job_claim_limited_call). Its statements must
-- run one after another: the lock (limits_lock), then the candidates and their key
-- locks (job_claim_candidates), then the claim that counts (job_claim_limited) and
-- the tokens it spends (rate_spend). (Under a queue limit alone, a claim is a
-- statement of its own: queue_room_function.) As a transaction they were five
-- round trips (BEGIN, three statements, COMMIT), and inside a worker, whose claim
-- thread must take the GIL back after every one, a limited claim took 4.5 ms
-- where the plain one took 2.6 (bench_limits, keys1000: 0.62x and 0.71x of
-- unlimited in two alternating comparisons; 0.84x and 0.80x with this function).
-- Here the server runs them. A PL/pgSQL function in READ COMMITTED
-- takes a snapshot per statement, so the count still sees every claim of the
-- queue and the keys committed before the locks were ours; the call is one
-- autocommit statement, so the claim, its spends and its locks commit or roll
-- back together, as the transaction did.
-- The function is the session's own (pg_temp), made from this template on a
-- connection's first limited claim: {{name}} is that named statement, each of
-- its parameters the function's p_<parameter> unless given (key=expression). It
-- always matches the code that calls it: no migration, and during a rolling
-- upgrade each worker runs its own. Rate spends: the tokens each rate key's
-- claimed jobs take (the largest rate and burst among them), and the queue's own.
CREATE OR REPLACE FUNCTION pg_temp.conveyor_claim_limited(
    p_queue text, p_queue_lock boolean, p_worker_id text,
    p_lease_s float8, p_now timestamptz, p_tasks text[], p_schema_version int,
    p_identity text[], p_window bigint, p_key_locks bigint, p_max_running bigint,
    p_queue_rate float8, p_queue_burst float8, p_limit bigint)
RETURNS TABLE (
    id bigint, queue text, task text, args text, state text, priority int, attempt int,
    max_attempts int, timeout_s float8, backoff text, stage text, unique_key text,
    idempotency_key text, lease_owner text, lease_token text, lease_expires_at timestamptz,
    created_at timestamptz, scheduled_at timestamptz, started_at timestamptz,
    finished_at timestamptz, batch_id bigint, context text, chain_root bigint, tenant text,
    base_priority int, concurrency_key text, rate_key text, rate_per_s float8,
    rate_burst float8, pinned_to text)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_keys text[];
    v_limits int[];
    v_ords bigint[];
    v_rated boolean;
    v_spread boolean;
    v_claimed bigint;
    v_spend record;
BEGIN
    PERFORM * FROM ({{limits_lock}}) AS l;
    SELECT array_agg(c.id), array_agg(c.concurrency_key), array_agg(c.concurrency_limit),
           array_agg(c.ord), bool_or(c.rate_key IS NOT NULL), bool_or(c.spread_group IS NOT NULL)
    INTO v_ids, v_keys, v_limits, v_ords, v_rated, v_spread
    FROM ({{job_claim_candidates}}) AS c;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    IF NOT (v_rated OR v_spread OR p_queue_lock) THEN  -- keys alone: job_claim_keyed
        RETURN QUERY {{job_claim_keyed ids=v_ids keys=v_keys limits=v_limits ords=v_ords}};
        RETURN;
    END IF;
    RETURN QUERY {{job_claim_limited ids=v_ids}};
    GET DIAGNOSTICS v_claimed = ROW_COUNT;
    IF v_claimed > 0 AND (v_rated OR p_queue_rate IS NOT NULL) THEN
        FOR v_spend IN
            SELECT j.rate_key AS key, count(*) AS taken, max(j.rate_per_s) AS rate,
                   max(j.rate_burst) AS burst
            FROM conveyor_jobs j
            WHERE j.id = ANY(v_ids) AND {UNFINISHED(j)}
              AND j.changed = pg_current_xact_id() AND j.rate_key IS NOT NULL
            GROUP BY j.rate_key
            UNION ALL
            SELECT 'queue=' || p_queue, v_claimed, p_queue_rate, p_queue_burst
            WHERE p_queue_rate IS NOT NULL
        LOOP
            {{rate_spend key=v_spend.key taken=v_spend.taken rate=v_spend.rate burst=v_spend.burst}};
        END LOOP;
    END IF;
END
$fn$

-- name: job_claim_limited_call
-- One limited claim (job_claim_limited_function), one round trip.
SELECT * FROM pg_temp.conveyor_claim_limited(
    %(queue)s::text, %(queue_lock)s::boolean, %(worker_id)s::text,
    %(lease_s)s::float8, %(now)s::timestamptz, %(tasks)s::text[], %(schema_version)s::int,
    %(identity)s::text[], %(window)s::bigint, %(key_locks)s::bigint, %(max_running)s::bigint,
    %(queue_rate)s::float8, %(queue_burst)s::float8, %(limit)s::bigint)

-- name: queue_room_function
-- Under a queue limit alone (no rate, no keyed jobs), a claim is job_claim in one
-- statement whose size is this function's answer (job_claim_queue_limited, made
-- from job_claim in dialect.py): the queue's lock (limits_lock), then the room
-- left (queue_running), each a statement of its own, so the count has a snapshot
-- taken after the lock was ours and sees every claim of the queue that committed
-- before. The claim around it, whose snapshot is older, never takes a job that
-- such a claim took: a row changed since its snapshot is locked in its newest
-- version and checked again (state IN ('available', 'scheduled')), as between any
-- two claims. Inside conveyor_claim_limited, the claim came back through RETURN
-- QUERY, copied once more, and that function's call cost ~0.2 ms a claim more
-- than the plain claim besides the count (a drain with a limit that never binds
-- at 0.92x of none). Made with conveyor_claim_limited, in the session's pg_temp.
CREATE OR REPLACE FUNCTION pg_temp.conveyor_queue_room(
    p_queue text, p_max_running bigint, p_limit bigint)
RETURNS bigint
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM * FROM ({{limits_lock queue_lock=true}}) AS l;
    RETURN greatest(0, least(p_limit, p_max_running - ({{queue_running}})));
END
$fn$

-- name: rate_spend
-- Take `taken` tokens from a bucket, refilling it first for the time elapsed.
INSERT INTO conveyor_rate_limits (key, tokens, updated_at)
VALUES (%(key)s, %(burst)s - %(taken)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (key) DO UPDATE
SET tokens = least(%(burst)s, conveyor_rate_limits.tokens
                   + extract(epoch FROM excluded.updated_at - conveyor_rate_limits.updated_at)
                     * %(rate)s) - %(taken)s,
    updated_at = excluded.updated_at

-- name: job_prune_ids
-- Retention: finished jobs older than the cutoff, oldest first by the finished
-- index (v14), a small batch at a time, never a job of an open batch or a chain
-- link not yet advanced. SKIP LOCKED: two workers pruning at once take different
-- rows. The state is named twice: the IN matches the partial index's predicate,
-- which a parameter alone cannot (a generic plan of the prepared statement, or
-- SQLite's planner, would scan the whole table).
SELECT j.id FROM conveyor_jobs j
WHERE j.state = %(state)s AND j.state IN ('succeeded', 'failed', 'cancelled')
  AND j.finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than_s)s)
  AND NOT (j.chain IS NOT NULL AND j.chain_next IS NULL)
  AND NOT EXISTS (SELECT 1 FROM conveyor_batches b WHERE b.id = j.batch_id AND b.state = 'running')
ORDER BY j.finished_at, j.id
LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED

-- name: tables_to_tidy
-- Conveyor's tables (those the search path shows) that need VACUUM or ANALYZE and
-- did not get it from autovacuum (off, or behind). Dead rows: every claim and
-- outcome leaves one, and until VACUUM removes them their entries in the fetch
-- index lie in front of the waiting jobs, so each claim walks them all (869,000
-- dead rows with autovacuum off: a claim of 100 took 4.6 ms, 2.5 ms after a
-- VACUUM). Rows changed since the last ANALYZE: a table bulk-loaded with a
-- million jobs and never analyzed is planned as if it held a handful, and the
-- claim sorted every waiting job of its queue (687 ms a claim, 160 jobs/s). The
-- same thresholds for both; the statistics are estimates, and enough.
SELECT name, dead, changed,
       dead >= least_rows AS vacuum, changed >= least_rows AS analyze
FROM (
    SELECT s.relname AS name, s.n_dead_tup AS dead, s.n_mod_since_analyze AS changed,
           greatest(%(min_dead)s::bigint, %(dead_fraction)s::float8 * s.n_live_tup) AS least_rows
    FROM pg_stat_user_tables s
    JOIN pg_class c ON c.oid = s.relid
    WHERE c.relname LIKE 'conveyor\_%%' AND pg_table_is_visible(c.oid)
) t
WHERE dead >= least_rows OR changed >= least_rows
ORDER BY greatest(dead, changed) DESC

-- name: table_planned_empty
-- A table whose statistics say no rows while it still has pages (the live jobs'
-- partition, analyzed while drained): the planner then expects 1 row from it
-- whatever fills it next, and an outcome batch of 100 is compared with every
-- other outcome (each one's write 2x slower until the next ANALYZE: 3,800 jobs/s
-- drained instead of 6,500). tidy() vacuums it, which hands the pages back.
SELECT 1 AS empty FROM pg_class
WHERE oid = to_regclass(quote_ident(%(name)s)) AND reltuples = 0 AND relpages > 0

-- name: notify
-- Hints to workers (queue names, "@flow", "@cancel"), delivered at commit.
SELECT pg_notify(%(channel)s, q) FROM unnest(%(queues)s::text[]) AS q

-- name: notify_events
SELECT pg_notify(%(events)s, q) FROM unnest(%(queues)s::text[]) AS q

-- name: replica_lag
-- How far a streaming replica trails (Conveyor(read_url=...)): 0 once it has
-- replayed all the WAL it received (an idle primary sends none, so the time of
-- the last replayed commit alone would grow while nothing is behind), else the
-- age of the last commit it replayed. NULL on a primary.
SELECT CASE WHEN NOT pg_is_in_recovery() THEN NULL
            WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
            ELSE extract(epoch FROM now() - pg_last_xact_replay_timestamp())
       END AS lag

-- name: change_stamp
-- What a notifier polls when it cannot LISTEN (behind a transaction pooler): the
-- newest change stamps of the unfinished jobs and of the batches, one index
-- descent each. The live partition by its name: through the parent, planning
-- the pruning of every day's partition took longer than the descents (1.6 ms
-- against 0.4 ms a poll). A stamp that commits after a newer one was seen, or a
-- job that leaves the live partition, does not move it: the poll after those is
-- the waiter's own.
SELECT (SELECT max(changed) FROM conveyor_jobs_live)::text AS jobs,
       (SELECT max(changed) FROM conveyor_batches)::text AS batches


-- name: changes_head
-- Where a stream that starts now begins: just before the oldest transaction that
-- may still commit (xid8 has no arithmetic: through numeric).
SELECT (pg_snapshot_xmin(pg_current_snapshot())::text::numeric - 1)::text AS head

-- name: counts_fold
-- The leader folds the deltas the triggers appended into the rollups (the queues'
-- and the batches'). One statement: a reader sees each delta in one table or the
-- other, never both.
WITH moved AS (
    DELETE FROM conveyor_count_deltas RETURNING queue, task, state, n
), batch_moved AS (
    DELETE FROM conveyor_batch_count_deltas RETURNING batch_id, state, n
), batch_folded AS (
    INSERT INTO conveyor_batch_counts (batch_id, state, n)
    SELECT batch_id, state, sum(n) FROM batch_moved GROUP BY batch_id, state
    ON CONFLICT (batch_id, state) DO UPDATE SET n = conveyor_batch_counts.n + excluded.n
)
INSERT INTO conveyor_counts (queue, task, state, n)
SELECT queue, task, state, sum(n) FROM moved GROUP BY queue, task, state
ON CONFLICT (queue, task, state) DO UPDATE SET n = conveyor_counts.n + excluded.n

-- name: job_add_days
-- The days of finished jobs from today to `ahead` days on (schema v17), made
-- ahead of the outcomes that will fill them.
SELECT conveyor_jobs_add_days(%(ahead)s::int) AS n

-- name: job_drop_days
-- Retention by whole days (schema v17): each day of the state's partition that
-- ended before the cutoff goes at once, with its attempts and its counts.
SELECT conveyor_jobs_drop_days(
    %(state)s::text,
    coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than_s)s::float8)
) AS n

-- name: filter_search
-- The arguments' JSON text contains the text, except in a task that declares
-- sensitive parameters (conveyor_task_sensitive, v20): its jobs are searched in
-- their other arguments only, one at a time (a keyword's name or value, a
-- positional value), so no one recovers a secret by guessing at it. Jobs of
-- other tasks pay one lookup in a hashed list of the few such tasks.
CASE WHEN conveyor_jobs.task IN (SELECT s.task FROM conveyor_task_sensitive s)
THEN EXISTS (
        SELECT 1
        FROM jsonb_each(CASE jsonb_typeof(conveyor_jobs.args -> 'kwargs')
                        WHEN 'object' THEN conveyor_jobs.args -> 'kwargs' ELSE '{}' END) k
        WHERE k.key NOT IN (SELECT s.name FROM conveyor_task_sensitive s
                            WHERE s.task = conveyor_jobs.task)
          AND (k.key ILIKE %(f_search)s OR k.value::text ILIKE %(f_search)s))
  OR EXISTS (
        SELECT 1
        FROM jsonb_array_elements(CASE jsonb_typeof(conveyor_jobs.args -> 'args')
                                  WHEN 'array' THEN conveyor_jobs.args -> 'args' ELSE '[]' END)
             WITH ORDINALITY a(value, n)
        WHERE a.n - 1 NOT IN (SELECT s.position FROM conveyor_task_sensitive s
                              WHERE s.task = conveyor_jobs.task AND s.position IS NOT NULL)
          AND a.value::text ILIKE %(f_search)s)
ELSE conveyor_jobs.args::text ILIKE %(f_search)s END
