-- MySQL / MariaDB dialect. Parameters are PyMySQL's %(name)s (the shared queries
-- are converted from :name). A NULL %(now)s means the server's clock (UTC), as on
-- PostgreSQL. What differs from the shared SQL, and why, is said at each query:
-- no UPDATE ... RETURNING (claims, finishes and rescues select the rows FOR
-- UPDATE, update them by primary key, and read them back, in one transaction),
-- no ON CONFLICT (INSERT IGNORE / ON DUPLICATE KEY UPDATE), no partial indexes,
-- `key` is a reserved word, and a derived table cannot see the outer query.
--
-- Live: the job table is partitioned (schema v22, see its migration): part = 0
-- is the partition of the jobs not finished. A statement that reads or changes
-- only such jobs says so (`part = 0`), a constant MariaDB prunes the finished
-- partitions by: otherwise a lookup by id probes every day of every finished
-- state (the primary key is (id, part)), and an index range is walked in each.

-- name: job_insert_head
-- INSERT IGNORE for ON CONFLICT DO NOTHING: an input whose unique or idempotency
-- key exists creates no row (and no error). The backend appends one row of
-- job_insert_row per job, and on MariaDB "RETURNING id, unique_key,
-- idempotency_key" (MySQL: one row per statement, ids from lastrowid).
INSERT IGNORE INTO conveyor_jobs (queue, task, args, state, priority, max_attempts, timeout_s,
                                  backoff, unique_key, idempotency_key, batch_id, stage, context,
                                  chain, chain_root, concurrency_key, concurrency_limit,
                                  rate_key, rate_per_s, rate_burst, pinned_to, spread_group,
                                  tenant, explicit, created_at, scheduled_at, changed)
VALUES

-- name: job_insert_row
(:queue, :task, :args_json, CASE WHEN :delay_s > 0 THEN 'scheduled' ELSE 'available' END,
 :priority, :max_attempts, :timeout_s, :backoff_json, :unique_key, :idempotency_key,
 :batch_id, :stage, :context_json, :chain_json, :chain_root, :concurrency_key,
 :concurrency_limit, :rate_key, :rate_per_s, :rate_burst, :pinned_to, :spread_group,
 :tenant, :explicit, {NOW}, {NOW_PLUS(:delay_s)}, {CHANGE})

-- name: job_claim_pick
-- Claim, first half: SKIP LOCKED lets many workers claim concurrently without
-- waiting on one another; the rows stay locked until the transaction ends, and
-- job_claim_update then takes them by primary key (no UPDATE ... RETURNING).
-- One queue per statement, walking the fetch index in order (the generated
-- columns fetch_queue and neg_priority: see migration 1). FORCE INDEX: InnoDB
-- locks every row a locking read examines, if only until it is found not to
-- match, and SKIP LOCKED passes over a row so locked. On a small table the
-- optimizer chose the spread index (spread_group IS NULL: every job), so a claim
-- on one queue examined, and locked for a moment, the jobs of every other queue,
-- and a claim there at that moment skipped its own job and came back empty.
SELECT id FROM conveyor_jobs FORCE INDEX (conveyor_jobs_fetch_idx)
WHERE fetch_queue = :queue  -- queue = :queue AND state IN ('available', 'scheduled')
  AND part = 0  -- (see "Live" at the top)
  AND scheduled_at <= {NOW}
  AND NOT EXISTS (SELECT 1 FROM conveyor_queues p WHERE p.name = :queue AND p.paused)
  AND (SELECT max(version) FROM conveyor_schema_version) <= :schema_version
  AND concurrency_key IS NULL AND rate_key IS NULL
  AND pinned_to IS NULL AND spread_group IS NULL
  AND (:tasks IS NULL OR task {IN(:task_list)})
ORDER BY neg_priority, scheduled_at, id  -- priority DESC, scheduled_at, id
LIMIT :limit
FOR UPDATE SKIP LOCKED

-- name: job_claim_update
-- Claim, second half: the picked rows (locked by this transaction). A row's lease
-- token is a hash of the claim's own random secret (the backend's
-- secrets.token_hex) and the row's id: unique per attempt, one row's token tells
-- nothing of another's, and no per-row lookup in a JSON object, which parsed the
-- whole object once per row (7% of the server's CPU in a drain).
UPDATE conveyor_jobs
SET state = 'running',
    attempt = attempt + 1,
    lease_owner = :worker_id,
    lease_token = SHA2(CONCAT(:token, '.', id), 256),
    lease_expires_at = {NOW_PLUS(:lease_s)},
    started_at = {NOW},
    error = NULL,
    changed = {CHANGE}
WHERE id {IN(:ids, bigint)} AND part = 0

-- name: job_get_claimed
-- The rows job_claim_update just made running, read back from the live partition.
SELECT * FROM conveyor_jobs WHERE id {IN(:ids, bigint)} AND part = 0

-- name: job_get_many
SELECT * FROM conveyor_jobs WHERE id {IN(:ids, bigint)}

-- name: job_claim_candidates
-- A limited claim's window of candidates (see the PostgreSQL job_claim_limited),
-- under the queue's lock. The backend ranks them (concurrency keys, rate
-- buckets, spread groups) exactly as the PostgreSQL query does.
SELECT j.id, j.concurrency_key, j.concurrency_limit, j.rate_key, j.rate_per_s, j.rate_burst,
       j.spread_group, j.pinned_to, j.priority, j.scheduled_at
FROM conveyor_jobs j FORCE INDEX (conveyor_jobs_fetch_idx)  -- (see job_claim_pick)
WHERE j.fetch_queue = :queue AND j.scheduled_at <= {NOW}  -- (see job_claim_pick)
  AND j.part = 0
  AND NOT EXISTS (SELECT 1 FROM conveyor_queues p WHERE p.name = :queue AND p.paused)
  AND (SELECT max(version) FROM conveyor_schema_version) <= :schema_version
  AND (:tasks IS NULL OR j.task {IN(:task_list)})
  -- pinned: one of the job's ids/tags must be this worker's id or one of its tags
  -- (PostgreSQL: jsonb ?|; JSON_OVERLAPS is not in MariaDB before 10.9)
  AND (j.pinned_to IS NULL OR EXISTS (
           SELECT 1 FROM JSON_TABLE(j.pinned_to, '$[*]' COLUMNS (v VARCHAR(255) PATH '$')) pin
           WHERE pin.v {IN(:identity)}))
  AND (j.spread_group IS NULL OR NOT EXISTS (
           SELECT 1 FROM conveyor_jobs g
           WHERE g.spread_group = j.spread_group AND g.id <> j.id
             AND (g.lease_owner = :worker_id
                  OR EXISTS (SELECT 1 FROM conveyor_attempts a
                             WHERE a.job_id = g.id AND a.worker_id = :worker_id))))
ORDER BY j.neg_priority, j.scheduled_at, j.id
LIMIT :window
FOR UPDATE SKIP LOCKED

-- name: limits_busy
-- Running jobs per concurrency key among the candidates' keys (across queues).
-- By the running-key column's index (v15).
SELECT running_key AS concurrency_key, count(*) AS n FROM conveyor_jobs
WHERE running_key {IN(:keys)} AND part = 0
GROUP BY running_key

-- name: limits_tokens
-- Rate buckets refilled for the time elapsed (the backend caps them at burst).
SELECT `key`, tokens, TIMESTAMPDIFF(MICROSECOND, updated_at, {NOW}) / 1000000 AS elapsed
FROM conveyor_rate_limits WHERE `key` {IN(:keys)}

-- name: queue_running
SELECT count(*) AS n FROM conveyor_jobs WHERE queue = :queue AND state = 'running' AND part = 0

-- name: limits_lock
-- A queue's limited claims serialise on its conveyor_queues row (a row lock held
-- to commit: PostgreSQL uses a transaction-scoped advisory lock). In READ
-- COMMITTED every later statement reads what the previous claim committed.
-- Only queues with a limit of their own: a keyed claim locks its keys instead.
SELECT name FROM conveyor_queues WHERE name = :queue FOR UPDATE

-- name: limits_lock_keys
-- A keyed claim's keys (a JSON array), each a named lock of this database's, tried
-- without waiting: a key another claim holds is left out of this claim (as SKIP
-- LOCKED leaves its rows), so claims never wait on each other's keys and cannot
-- deadlock, and claims whose keys meet never count a key at once (PostgreSQL: an
-- advisory lock per key). Named locks belong to the session, not the transaction:
-- the backend releases them after the COMMIT (limits_unlock_keys), so the next
-- claim of a key sees what this one committed. got: 1 if the lock is ours.
SELECT k.v AS `key`, GET_LOCK(CONCAT('conveyor.', MD5(CONCAT(DATABASE(), '/', k.v))), 0) AS got
FROM JSON_TABLE(:keys, '$[*]' COLUMNS (v VARCHAR(255) PATH '$')) k

-- name: limits_unlock_keys
SELECT RELEASE_ALL_LOCKS() AS released

-- name: rate_spend
INSERT INTO conveyor_rate_limits (`key`, tokens, updated_at)
VALUES (:key, :burst - :taken, {NOW})
ON DUPLICATE KEY UPDATE
    tokens = LEAST(:burst, tokens + TIMESTAMPDIFF(MICROSECOND, updated_at, VALUES(updated_at))
                                    / 1000000 * :rate) - :taken,
    updated_at = VALUES(updated_at)

-- name: job_finalize_pick
-- Fencing (see the PostgreSQL job_finalize_many): rows still running under the
-- outcome's token, locked; the backend updates each (its values differ per row).
SELECT id, lease_token, cancel_requested, attempt, started_at, queue,
       (batch_id IS NOT NULL OR chain IS NOT NULL) AS flow
FROM conveyor_jobs
WHERE id {IN(:ids, bigint)} AND lease_token {IN(:tokens)} AND state = 'running' AND part = 0
ORDER BY id
FOR UPDATE

-- name: job_finalize_one
-- (See the SQLite query; the row is locked and its token checked already.)
UPDATE conveyor_jobs
SET state = CASE WHEN cancel_requested AND :state <> 'failed' THEN 'cancelled' ELSE :state END,
    result = :result_json,
    error = CASE WHEN cancel_requested AND :state NOT IN ('failed', 'cancelled')
                 THEN 'cancelled while running (it finished before its worker learned)'
                 ELSE :error END,
    scheduled_at = CASE WHEN :state = 'scheduled' THEN {NOW_PLUS(coalesce(:retry_in_s, 0))}
                        WHEN :outcome = 'stage' THEN {NOW}
                        ELSE scheduled_at END,
    finished_at = CASE WHEN :state IN ('succeeded', 'failed', 'cancelled') OR cancel_requested
                       THEN {NOW} END,
    stage = CASE WHEN :outcome = 'stage' AND NOT cancel_requested THEN :next_stage ELSE stage END,
    context = CASE WHEN :outcome = 'stage' AND NOT cancel_requested THEN :context_json
                   ELSE context END,
    attempt = CASE WHEN :outcome = 'stage' THEN 0
                   WHEN :outcome = 'snoozed' THEN GREATEST(attempt - 1, 0)
                   ELSE attempt END,
    priority = coalesce(:priority, priority),
    max_attempts = coalesce(:max_attempts, max_attempts),
    -- MySQL assigns left to right: lease_owner reads cancel_requested, so it is
    -- set before cancel_requested is cleared
    lease_owner = CASE WHEN :state = 'succeeded' AND NOT cancel_requested THEN :worker_id END,
    cancel_requested = FALSE,
    lease_token = NULL, lease_expires_at = NULL,
    changed = {CHANGE}
WHERE id = :id AND lease_token = :token AND state = 'running' AND part = 0

-- name: job_succeed_many
-- The common case in one statement: plain successes (no error, stage, retry or
-- option change), rows locked and fenced by job_finalize_pick. The same values
-- as job_finalize_one gives them; each result comes from a JSON object keyed by
-- id (a missing key: SQL NULL), or, when all are the same (:uniform, most often
-- "null": handlers that return nothing), is that one :result_json, without the
-- object parsed once per row. cancel_requested is read before it is cleared
-- (MySQL assigns left to right).
UPDATE conveyor_jobs
SET state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'succeeded' END,
    result = IF(:uniform, :result_json, JSON_EXTRACT(:results, CONCAT('$."', id, '"'))),
    error = CASE WHEN cancel_requested
                 THEN 'cancelled while running (it finished before its worker learned)' END,
    finished_at = {NOW},
    lease_owner = CASE WHEN cancel_requested THEN NULL ELSE :worker_id END,
    cancel_requested = FALSE,
    lease_token = NULL, lease_expires_at = NULL,
    changed = {CHANGE}
WHERE id {IN(:ids, bigint)} AND state = 'running' AND part = 0

-- name: job_finalized
SELECT id, state, attempt, error, queue, started_at FROM conveyor_jobs WHERE id {IN(:ids, bigint)}

-- name: job_release_pick
SELECT id, attempt AS ran, stage, started_at, queue FROM conveyor_jobs
WHERE id {IN(:ids, bigint)} AND lease_token {IN(:tokens)} AND state = 'running' AND part = 0
ORDER BY id
FOR UPDATE

-- name: job_release_one
UPDATE conveyor_jobs
SET state = 'available', attempt = GREATEST(attempt - 1, 0), cancel_requested = FALSE,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, changed = {CHANGE}
WHERE id = :id AND lease_token = :token AND state = 'running' AND part = 0

-- name: worker_upsert
-- (See the PostgreSQL worker_heartbeat.) ON DUPLICATE KEY UPDATE reports 1 row
-- for an insert and 2 for an update: that is how "inserted" is known.
INSERT INTO conveyor_workers (id, hostname, pid, queues, concurrency, tags, tasks, started_at,
                              last_seen_at)
VALUES (:id, :hostname, :pid, :queues, :concurrency, :tags, :tasks, {NOW}, {NOW})
ON DUPLICATE KEY UPDATE last_seen_at = VALUES(last_seen_at)

-- name: worker_get
-- A row inserted by this heartbeat has last_seen_at = started_at (as on SQLite).
SELECT stop_requested, started_at = last_seen_at AS inserted FROM conveyor_workers WHERE id = :id

-- name: job_expired_leases
-- (See the PostgreSQL job_rescue.) SKIP LOCKED: two rescuers take different rows.
SELECT j.id, j.lease_owner, j.started_at,
       CASE WHEN j.lease_expires_at < {NOW} THEN 'was held past its deadline'
            ELSE 'stopped heartbeating' END AS why
FROM conveyor_jobs j
WHERE j.state = 'running' AND j.part = 0
  AND (j.lease_expires_at < {NOW}
       OR (j.lease_expires_at IS NULL AND NOT EXISTS (
               SELECT 1 FROM conveyor_workers w
               WHERE w.id = j.lease_owner AND w.last_seen_at >= {NOW_MINUS(:worker_ttl_s)})))
ORDER BY j.id
LIMIT :limit
FOR UPDATE SKIP LOCKED

-- name: job_rescue_one
UPDATE conveyor_jobs
SET error = CONCAT('lease lost on attempt ', attempt, ' of ', max_attempts, ' (worker ',
                   lease_owner, ' ', :why, '); ',
                   CASE WHEN attempt >= max_attempts THEN 'no attempts left, giving up'
                        ELSE 'requeued' END),
    -- left to right: state last, after error and finished_at read the attempts
    finished_at = CASE WHEN attempt >= max_attempts THEN {NOW} END,
    state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'available' END,
    cancel_requested = FALSE,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    changed = {CHANGE}
WHERE id = :id AND state = 'running' AND part = 0

-- name: job_rescued
SELECT id, state, attempt, stage, queue, error,
       (batch_id IS NOT NULL OR chain IS NOT NULL) AS flow
FROM conveyor_jobs WHERE id {IN(:ids, bigint)}

-- name: job_schedule_pick
-- By the time index (schema v25): due_or_finished_at is scheduled_at while the
-- job is scheduled, and NULL (never in the range) while it waits or runs.
SELECT id, queue FROM conveyor_jobs
WHERE due_or_finished_at <= {NOW} AND state = 'scheduled' AND part = 0
ORDER BY due_or_finished_at
LIMIT :limit
FOR UPDATE SKIP LOCKED

-- name: job_schedule_ids
UPDATE conveyor_jobs SET state = 'available', changed = {CHANGE}
WHERE id {IN(:ids, bigint)} AND state = 'scheduled' AND part = 0

-- name: schema_version_table
CREATE TABLE IF NOT EXISTS conveyor_schema_version (
    version    integer      NOT NULL PRIMARY KEY,
    name       varchar(255) NOT NULL,
    applied_at datetime(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin

-- name: schema_version_exists
SELECT count(*) AS present FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = 'conveyor_schema_version'

-- name: migration_lock
-- A named lock of the session (MySQL has no transaction-scoped advisory lock, and
-- DDL commits implicitly): the backend releases it after migrating.
SELECT GET_LOCK(CONCAT(DATABASE(), '.conveyor_migrate'), 300) AS got

-- name: migration_unlock
SELECT RELEASE_LOCK(CONCAT(DATABASE(), '.conveyor_migrate')) AS released

-- name: migration_progress_table
-- How far a migration got, statement by statement (MySQL's DDL commits at once,
-- so a migration cut off midway is left half done): the next migrator goes on
-- from there. A migration's row goes once its version is recorded.
CREATE TABLE IF NOT EXISTS conveyor_migration_progress (
    version integer NOT NULL PRIMARY KEY,
    done    integer NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin

-- name: migration_progress
SELECT done FROM conveyor_migration_progress WHERE version = :version

-- name: migration_progress_set
INSERT INTO conveyor_migration_progress (version, done) VALUES (:version, :done)
ON DUPLICATE KEY UPDATE done = VALUES(done)

-- name: migration_progress_clear
DELETE FROM conveyor_migration_progress
WHERE version <= (SELECT coalesce(max(version), 0) FROM conveyor_schema_version)

-- name: queue_list
-- No FULL JOIN in MySQL (and a derived table cannot see the outer query): every
-- queue with counts or settings, then both sides joined to it.
WITH c AS (
    SELECT queue, JSON_OBJECTAGG(state, n) AS counts FROM (
        SELECT queue, state, sum(n) AS n FROM (
            SELECT queue, state, n FROM conveyor_counts
            UNION ALL
            SELECT queue, state, n FROM conveyor_count_deltas) x
        GROUP BY queue, state HAVING sum(n) <> 0) s
    GROUP BY queue
)
SELECT n.name, coalesce(q.paused, FALSE) AS paused, q.max_running, q.rate_per_s, q.rate_burst,
       coalesce(c.counts, '{}') AS counts
FROM (SELECT queue AS name FROM c UNION SELECT name FROM conveyor_queues) n
LEFT JOIN conveyor_queues q ON q.name = n.name
LEFT JOIN c ON c.queue = n.name
ORDER BY n.name

-- name: queue_oldest_waiting
-- (A derived table cannot see the outer query in MySQL: two scalar subqueries.)
SELECT q.queue,
       LEAST(coalesce(a.s, d.s), coalesce(d.s, a.s)) AS since
FROM (SELECT DISTINCT queue FROM conveyor_counts
      WHERE state IN ('available', 'scheduled') AND n > 0
      UNION
      SELECT DISTINCT queue FROM conveyor_count_deltas
      WHERE state IN ('available', 'scheduled')) q
LEFT JOIN (SELECT queue, min(scheduled_at) AS s FROM conveyor_jobs
           WHERE state = 'available' AND part = 0 GROUP BY queue) a ON a.queue = q.queue
LEFT JOIN (SELECT queue, min(scheduled_at) AS s FROM conveyor_jobs
           WHERE due_or_finished_at <= {NOW} AND state = 'scheduled' AND part = 0  -- (v25)
           GROUP BY queue) d
       ON d.queue = q.queue

-- name: job_age_pick
-- Priority aging (see the PostgreSQL query), candidates first: waiting jobs whose
-- age crossed a multiple of aging_s in the last window_s seconds (or, without a
-- window, every waiting job old enough), below their target priority.
SELECT j.id, coalesce(j.base_priority, j.priority) AS base,
       coalesce(j.base_priority, j.priority)
         + LEAST(:max_boost, FLOOR(TIMESTAMPDIFF(MICROSECOND, j.scheduled_at, {NOW})
                                   / 1000000 / :aging_s)) AS target
FROM conveyor_jobs j
WHERE j.state = 'available' AND j.part = 0
  AND j.scheduled_at <= {NOW_MINUS(:aging_s)}
  AND (:window_s IS NULL OR EXISTS (
          SELECT 1 FROM JSON_TABLE(:ks, '$[*]' COLUMNS (k INT PATH '$')) w
          WHERE j.scheduled_at <= {NOW_MINUS(w.k * :aging_s)}
            AND j.scheduled_at > {NOW_MINUS(w.k * :aging_s + :window_s)}))
  AND j.priority < coalesce(j.base_priority, j.priority)
        + LEAST(:max_boost, FLOOR(TIMESTAMPDIFF(MICROSECOND, j.scheduled_at, {NOW})
                                  / 1000000 / :aging_s))
ORDER BY j.scheduled_at, j.id
LIMIT :limit
FOR UPDATE SKIP LOCKED

-- name: job_age_one
UPDATE conveyor_jobs SET base_priority = :base, priority = :target WHERE id = :id AND part = 0

-- fragment: prune_where
-- The finished jobs retention may delete (job_prune_ids, job_prune_count).
WHERE j.due_or_finished_at < {NOW_MINUS(:older_than_s)}
  AND j.state = :state AND j.finished_at < {NOW_MINUS(:older_than_s)}
  AND j.part >= FIELD(:state, 'succeeded', 'failed', 'cancelled') * 1000000
  AND j.part < (FIELD(:state, 'succeeded', 'failed', 'cancelled') + 1) * 1000000
  AND NOT (j.chain IS NOT NULL AND j.chain_next IS NULL)
  AND NOT EXISTS (SELECT 1 FROM conveyor_batches b WHERE b.id = j.batch_id AND b.state = 'running')

-- name: job_prune_ids
-- By the time index (schema v25; due_or_finished_at is finished_at once the job
-- is finished), in the state's own partitions only (its range of part, see
-- migration 22): the index has no state, and the other states' rows in it would
-- each be read to be thrown away.
SELECT j.id FROM conveyor_jobs j
{FRAGMENT(prune_where)}
ORDER BY j.due_or_finished_at, j.id
LIMIT :limit
FOR UPDATE SKIP LOCKED

-- name: job_prune_count
SELECT count(*) AS n FROM conveyor_jobs j
{FRAGMENT(prune_where)}

-- Jobs of a batch (schema v25): the batch index is on batch_id alone, and the
-- partitions tell the live jobs (part = 0) from the finished ones.

-- name: batch_ready
SELECT b.id FROM conveyor_batches b
WHERE b.state = 'running'
  AND NOT EXISTS (SELECT 1 FROM conveyor_jobs j
                  WHERE j.batch_id = b.id AND j.part = 0
                    AND j.state IN ('scheduled', 'available', 'running'))
ORDER BY b.id
LIMIT :limit

-- name: batch_first_finished
SELECT min(finished_at) AS at FROM conveyor_jobs
WHERE batch_id = :id AND part > 0 AND state IN ('succeeded', 'failed', 'cancelled')

-- name: batch_cancel_jobs
UPDATE conveyor_jobs
SET state = 'cancelled', finished_at = {NOW}, error = 'cancelled with its batch',
    changed = {CHANGE}
WHERE batch_id = :id AND part = 0 AND state IN ('scheduled', 'available')

-- name: queue_mark_keyed
INSERT INTO conveyor_queues (name, keyed, updated_at) VALUES (:queue, TRUE, {NOW})
ON DUPLICATE KEY UPDATE keyed = TRUE

-- name: changes_head
-- Where a stream that starts now begins: just before the horizon (the backend's
-- _horizon, as on PostgreSQL the oldest transaction that may still commit).
SELECT {HORIZON} - 1 AS head

-- name: change_take
-- A writing transaction's change number (see _change in backend.py).
INSERT INTO conveyor_change_tx () VALUES ()

-- name: change_numbers
-- (Read dirty, on a READ UNCOMMITTED connection: numbers of open transactions too.)
SELECT id FROM conveyor_change_tx ORDER BY id

-- name: change_numbers_committed
SELECT id FROM conveyor_change_tx WHERE id BETWEEN :low AND :high

-- name: change_prune
-- Numbers below the horizon are of no more use, but the largest committed one is
-- kept: the next horizon starts from it.
DELETE FROM conveyor_change_tx WHERE id < :horizon - 1

-- Folding the deltas the triggers appended into their rollups, in the database:
-- the rows never travel to the leader (PyMySQL parsed 4-5 of them per job, a
-- fifth of a MariaDB worker's CPU in a drain). Per table, in one transaction: the
-- id up to which to fold (10,000 rows at most; a read of committed ids), every
-- delta up to it locked (one of a transaction still open is waited for, never
-- skipped: ids are handed out in order, so after this no row up to it can appear
-- or change), their sums added, and exactly those rows deleted.

-- name: counts_fold_high
SELECT coalesce((SELECT id FROM conveyor_count_deltas ORDER BY id LIMIT 1 OFFSET 9999),
                (SELECT max(id) FROM conveyor_count_deltas)) AS high

-- name: counts_fold_lock
SELECT count(*) AS n FROM conveyor_count_deltas WHERE id <= :high FOR UPDATE

-- name: counts_fold_add
INSERT INTO conveyor_counts (queue, task, state, n)
SELECT queue, task, state, s FROM (
    SELECT queue, task, state, SUM(n) AS s FROM conveyor_count_deltas
    WHERE id <= :high GROUP BY queue, task, state) d
WHERE s <> 0
ON DUPLICATE KEY UPDATE n = n + VALUES(n)

-- name: counts_fold_delete
DELETE FROM conveyor_count_deltas WHERE id <= :high

-- name: batch_counts_fold_high
-- The same for the batches' rollup (schema v16).
SELECT coalesce((SELECT id FROM conveyor_batch_count_deltas ORDER BY id LIMIT 1 OFFSET 9999),
                (SELECT max(id) FROM conveyor_batch_count_deltas)) AS high

-- name: batch_counts_fold_lock
SELECT count(*) AS n FROM conveyor_batch_count_deltas WHERE id <= :high FOR UPDATE

-- name: batch_counts_fold_add
INSERT INTO conveyor_batch_counts (batch_id, state, n)
SELECT batch_id, state, s FROM (
    SELECT batch_id, state, SUM(n) AS s FROM conveyor_batch_count_deltas
    WHERE id <= :high GROUP BY batch_id, state) d
WHERE s <> 0
ON DUPLICATE KEY UPDATE n = n + VALUES(n)

-- name: batch_counts_fold_delete
DELETE FROM conveyor_batch_count_deltas WHERE id <= :high

-- name: max_change
-- The notifier's poll: a descent of each change index.
SELECT (SELECT max(changed) FROM conveyor_jobs) AS jobs,
       (SELECT max(changed) FROM conveyor_batches) AS batches

-- name: job_find_by_keys
-- (See the shared query.) A locking read: it reads the latest committed rows even
-- in a caller's REPEATABLE READ transaction (MySQL's default), whose snapshot
-- may predate the job that made INSERT IGNORE skip the input.
-- By unique_key_active (the unique key while unfinished; schema v22: live only).
SELECT id, unique_key, idempotency_key, task, args FROM conveyor_jobs
WHERE idempotency_key {IN(:idempotency_keys)}
   OR unique_key_active {IN(:unique_keys)}
LOCK IN SHARE MODE

-- Upserts: ON DUPLICATE KEY UPDATE where the shared SQL has ON CONFLICT.

-- name: batch_insert
-- INSERT IGNORE: a known idempotency key inserts nothing (the backend then
-- returns the existing batch). The id comes from lastrowid.
INSERT IGNORE INTO conveyor_batches (name, task, total, state, idempotency_key, fingerprint,
                                     on_complete, created_at, changed)
VALUES (:name, :task, :total, 'running', :idempotency_key, :fingerprint, :on_complete, {NOW},
        {CHANGE})

-- name: workflow_insert
-- INSERT IGNORE, as batch_insert: a known idempotency key inserts nothing.
INSERT IGNORE INTO conveyor_workflows (name, state, idempotency_key, fingerprint, total,
                                       open_nodes, created_at, updated_at)
VALUES (:name, 'running', :idempotency_key, :fingerprint, :total, :total, {NOW}, {NOW})

-- name: leader_attempt_elect
-- Take the lease if it is free or expired, renew it if it is ours. MySQL assigns
-- left to right: holder first (from the old row), then expires_at only if the
-- holder is now the caller.
INSERT INTO conveyor_leaders (name, holder, expires_at)
VALUES (:name, :holder, {NOW_PLUS(:ttl_s)})
ON DUPLICATE KEY UPDATE
    holder = IF(holder = VALUES(holder) OR expires_at < {NOW}, VALUES(holder), holder),
    expires_at = IF(holder = VALUES(holder), VALUES(expires_at), expires_at)

-- name: periodic_register
INSERT IGNORE INTO conveyor_periodics (name, first_seen_at) VALUES (:name, {NOW})

-- name: queue_set_paused
INSERT INTO conveyor_queues (name, paused, updated_at) VALUES (:name, :paused, {NOW})
ON DUPLICATE KEY UPDATE paused = VALUES(paused), updated_at = VALUES(updated_at)

-- name: queue_set_limit
INSERT INTO conveyor_queues (name, max_running, updated_at) VALUES (:name, :max_running, {NOW})
ON DUPLICATE KEY UPDATE max_running = VALUES(max_running), updated_at = VALUES(updated_at)

-- name: queue_set_rate
INSERT INTO conveyor_queues (name, rate_per_s, rate_burst, updated_at)
VALUES (:name, :rate_per_s, :rate_burst, {NOW})
ON DUPLICATE KEY UPDATE rate_per_s = VALUES(rate_per_s), rate_burst = VALUES(rate_burst),
                        updated_at = VALUES(updated_at)

-- name: task_sensitive_upsert
INSERT INTO conveyor_task_sensitive (task, name, position) VALUES (:task, :name, :position)
ON DUPLICATE KEY UPDATE position = VALUES(position)

-- name: task_settings_upsert
INSERT INTO conveyor_task_settings (task, batch_size, poll_interval_s, max_processing_s,
                                    max_attempts, retry_interval_s, retry_cap_s, updated_at)
VALUES (:task, :batch_size, :poll_interval_s, :max_processing_s, :max_attempts,
        :retry_interval_s, :retry_cap_s, {NOW})
ON DUPLICATE KEY UPDATE batch_size = VALUES(batch_size),
    poll_interval_s = VALUES(poll_interval_s), max_processing_s = VALUES(max_processing_s),
    max_attempts = VALUES(max_attempts), retry_interval_s = VALUES(retry_interval_s),
    retry_cap_s = VALUES(retry_cap_s), updated_at = VALUES(updated_at)

-- name: job_chain_due
-- By the generated chain_due_state and its index (no partial indexes here: the
-- shared query's chain_next IS NULL matches every job without a chain, so it
-- scanned the table on every pass of the flow service).
SELECT id, state, result, error, chain, chain_root FROM conveyor_jobs
WHERE chain_due_state IN ('succeeded', 'failed', 'cancelled')
ORDER BY id
LIMIT :limit

-- name: filter_search
-- (See the PostgreSQL filter_search: a task with sensitive parameters is searched
-- in its other arguments only, one at a time.) A keyword's name and value are
-- paired by their order in the document (JSON_KEYS and the `.*` path both follow it).
CASE WHEN conveyor_jobs.task IN (SELECT s.task FROM conveyor_task_sensitive s)
THEN EXISTS (
        SELECT 1
        FROM JSON_TABLE(JSON_KEYS(conveyor_jobs.args, '$.kwargs'), '$[*]'
                        COLUMNS (n FOR ORDINALITY,
                                 k varchar(1000) CHARACTER SET utf8mb4 PATH '$')) kk
        JOIN JSON_TABLE(conveyor_jobs.args, '$.kwargs.*'
                        COLUMNS (n FOR ORDINALITY, v JSON PATH '$')) vv ON vv.n = kk.n
        WHERE kk.k COLLATE utf8mb4_bin NOT IN (
                  SELECT s.name FROM conveyor_task_sensitive s WHERE s.task = conveyor_jobs.task)
          AND (LOWER(kk.k) LIKE LOWER(:f_search) OR LOWER(vv.v) LIKE LOWER(:f_search)))
  OR EXISTS (
        SELECT 1
        FROM JSON_TABLE(conveyor_jobs.args, '$.args[*]'
                        COLUMNS (n FOR ORDINALITY, v JSON PATH '$')) a
        WHERE a.n - 1 NOT IN (SELECT s.position FROM conveyor_task_sensitive s
                              WHERE s.task = conveyor_jobs.task AND s.position IS NOT NULL)
          AND LOWER(a.v) LIKE LOWER(:f_search))
ELSE LOWER(CAST(conveyor_jobs.args AS CHAR)) LIKE LOWER(:f_search) END

-- name: job_add_days
-- The days of finished jobs from today to `ahead` days on (schema v22), made
-- ahead of the outcomes that will fill them; @conveyor_days: how many.
CALL conveyor_jobs_add_days(:ahead)

-- name: job_drop_days
-- Retention by whole days (schema v22): each day of the state's partitions that
-- ended before the cutoff goes at once, with its attempts, keys and counts.
CALL conveyor_jobs_drop_days(:state, {NOW_MINUS(:older_than_s)})

-- name: job_days_result
SELECT coalesce(@conveyor_days, 0) AS days, coalesce(@conveyor_gone, 0) AS gone

-- name: upkeep_wait
-- Partition upkeep waits this long for the table's metadata lock, then gives up
-- until the next pass: meanwhile every statement on the table waits behind it.
SET SESSION lock_wait_timeout = :wait_s

-- name: upkeep_wait_default
SET SESSION lock_wait_timeout = DEFAULT

-- Durable steps and events (schema v24): INSERT IGNORE for ON CONFLICT DO
-- NOTHING (the only key that can conflict is the primary key), and a DELETE with
-- its own LIMIT (no LIMIT in an IN subquery).

-- name: step_insert
INSERT IGNORE INTO conveyor_job_steps (job_id, name, kind, result, done, timed_out, wake_at,
                                       event_key, created_at)
VALUES (:job_id, :name, :kind, :result, :done, FALSE,
        {NOW_PLUS(:wake_in_s)},
        :event_key, {NOW})

-- name: event_insert
INSERT IGNORE INTO conveyor_events (event_key, payload, created_at) VALUES (:key, :payload, {NOW})

-- name: event_prune
DELETE FROM conveyor_events WHERE created_at < {NOW_MINUS(:older_than_s)}
ORDER BY created_at LIMIT :limit
