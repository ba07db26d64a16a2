-- Queries every dialect runs as they are (a dialect's queries.sql may override
-- any of them). Parameters are :name; {MACROS} stand for what differs between
-- databases (see loader.py). Portable SQL: no casts, booleans as TRUE/FALSE,
-- and no RETURNING or ON CONFLICT except in the upserts at the end (a dialect
-- without them overrides those).

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM conveyor_schema_version

-- name: schema_version_insert
INSERT INTO conveyor_schema_version (version, name) VALUES (:version, :name)

-- name: job_get
SELECT * FROM conveyor_jobs WHERE id = :id

-- name: job_find_by_keys
-- Existing jobs behind keys that conflicted: idempotency keys forever, unique keys
-- only while unfinished (the same predicate as the partial unique index). Two
-- parts and not an OR: on PostgreSQL the unique keys' index is on the live
-- partition only (schema v17), and an OR had every finished day scanned for them.
-- The task and arguments (their headers: the call's fingerprint) tell a repeat of
-- an idempotency key from a different request (logic.check_same_call).
SELECT id, unique_key, idempotency_key, task, args FROM conveyor_jobs
WHERE idempotency_key {IN(:idempotency_keys)}
UNION ALL
SELECT id, unique_key, idempotency_key, task, args FROM conveyor_jobs
WHERE unique_key {IN(:unique_keys)} AND state IN ('scheduled', 'available', 'running')

-- name: job_list
-- Keyset pagination: the previous page's last id is the cursor (filter_before_id),
-- never OFFSET, so a page deep in a big table costs what the first one does.
SELECT * FROM conveyor_jobs WHERE {FILTER} ORDER BY id DESC LIMIT :limit

-- name: job_count
SELECT state, count(*) AS n FROM conveyor_jobs WHERE {FILTER} GROUP BY state

-- Conditions of a JobFilter, one per field: the backend joins those in use with AND.
-- name: filter_ids
id {IN(:f_ids, bigint)}
-- name: filter_queues
queue {IN(:f_queues)}
-- name: filter_tasks
task {IN(:f_tasks)}
-- name: filter_states
state {IN(:f_states)}
-- name: filter_stage
stage = :f_stage
-- name: filter_tenant
tenant = :f_tenant
-- name: filter_idempotency_keys
idempotency_key {IN(:f_idempotency_keys)}
-- name: filter_batch_id
batch_id = :f_batch_id
-- name: filter_created_after
created_at >= {TS(:f_created_after)}
-- name: filter_created_before
created_at < {TS(:f_created_before)}
-- name: filter_finished_after
finished_at >= {TS(:f_finished_after)}
-- name: filter_finished_before
finished_at < {TS(:f_finished_before)}
-- (filter_search: each dialect's own, to skip sensitive arguments with its JSON
-- functions)
-- name: filter_due_before
scheduled_at <= {TS(:f_due_before)}
-- name: filter_unpaused
NOT EXISTS (SELECT 1 FROM conveyor_queues p WHERE p.name = conveyor_jobs.queue AND p.paused)
-- name: filter_before_id
id < :f_before_id

-- name: job_attempts
-- The attempt log, and a job's succeeded attempt, which (from schema v12) is not
-- logged: the job row keeps its attempt number, stage, times and worker.
SELECT job_id, attempt, stage, worker_id, started_at, finished_at, outcome, error, traceback
FROM (
    SELECT a.job_id, a.attempt, a.stage, a.worker_id, a.started_at, a.finished_at, a.outcome,
           a.error, a.traceback, 0 AS late, a.id AS seq
    FROM conveyor_attempts a WHERE a.job_id = :id
    UNION ALL
    SELECT j.id, j.attempt, j.stage, j.lease_owner, j.started_at, j.finished_at, 'succeeded',
           NULL, NULL, 1, j.id
    FROM conveyor_jobs j
    WHERE j.id = :id AND j.state = 'succeeded' AND j.lease_owner IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM conveyor_attempts a
                      WHERE a.job_id = j.id AND a.attempt = j.attempt AND a.outcome = 'succeeded')
) log
ORDER BY late, seq

-- name: attempt_find
-- Is this exact outcome recorded already (a write that committed before the
-- connection broke, sent again)? A success is recorded by the job row itself.
SELECT id FROM conveyor_attempts
WHERE job_id = :job_id AND attempt = :attempt AND worker_id = :worker_id AND outcome = :outcome
UNION ALL
SELECT id FROM conveyor_jobs
WHERE :outcome = 'succeeded' AND id = :job_id AND state = 'succeeded' AND attempt = :attempt
  AND lease_owner = :worker_id

-- name: job_select_retryable
-- Bulk actions work through a filter in bounded slices, oldest first, each slice
-- its own short transaction; rows are locked so two operators never race.
SELECT id FROM conveyor_jobs
WHERE {FILTER} AND state IN ('failed', 'cancelled')
ORDER BY id LIMIT :limit {FOR_UPDATE}

-- name: job_select_cancellable
SELECT id FROM conveyor_jobs
WHERE {FILTER} AND state IN ('scheduled', 'available')
ORDER BY id LIMIT :limit {FOR_UPDATE}

-- name: job_select_running
SELECT id FROM conveyor_jobs
WHERE {FILTER} AND state = 'running' AND NOT cancel_requested
ORDER BY id LIMIT :limit {FOR_UPDATE}

-- name: job_select_deletable
SELECT id FROM conveyor_jobs
WHERE {FILTER} AND state <> 'running'
ORDER BY id LIMIT :limit {FOR_UPDATE}

-- name: job_queues_of
SELECT DISTINCT queue FROM conveyor_jobs WHERE id {IN(:ids, bigint)}

-- name: attempt_insert
-- An ended attempt (dialects that finish jobs a statement per row; PostgreSQL
-- logs attempts inside its job_finalize_many).
INSERT INTO conveyor_attempts (job_id, attempt, stage, worker_id, started_at, finished_at,
                               outcome, error, traceback)
VALUES (:job_id, :attempt, :stage, :worker_id, :started_at, {NOW}, :outcome, :error, :traceback)

-- name: job_held
-- What a worker holds, read at its heartbeat (PostgreSQL: inside worker_heartbeat).
SELECT id, lease_token, cancel_requested FROM conveyor_jobs
WHERE lease_owner = :id AND state = 'running'

-- name: job_retry_ids
-- Operator retry: at least one more attempt than were made; a cancel request of
-- the run that was cancelled is forgotten; a chain that ended at this job (0)
-- is open again, so the flow service advances it when the job succeeds.
UPDATE conveyor_jobs
SET state = 'available', max_attempts = {GREATEST(max_attempts, attempt + 1)},
    scheduled_at = {NOW}, finished_at = NULL, cancel_requested = FALSE,
    chain_next = CASE WHEN chain_next = 0 THEN NULL ELSE chain_next END, changed = {CHANGE}
WHERE id {IN(:ids, bigint)} AND state IN ('failed', 'cancelled')

-- name: batch_reopen_for_jobs
-- A retried job of a closed batch reopens it (state running, final counts gone);
-- the next closing has a new number, which keys a new callback.
UPDATE conveyor_batches
SET state = 'running', finished_at = NULL, counts = NULL, cancelled_at = NULL,
    changed = {CHANGE}
WHERE state <> 'running'
  AND id IN (SELECT batch_id FROM conveyor_jobs WHERE id {IN(:ids, bigint)} AND batch_id IS NOT NULL)

-- name: job_cancel_ids
UPDATE conveyor_jobs
SET state = 'cancelled', finished_at = {NOW}, error = 'cancelled before it started',
    changed = {CHANGE}
WHERE id {IN(:ids, bigint)} AND state IN ('scheduled', 'available')

-- name: job_flag_cancel_ids
-- A running job cannot be stopped from here: flag it, and its worker cancels it
-- at its next heartbeat (sooner where a notification wakes that heartbeat).
UPDATE conveyor_jobs SET cancel_requested = TRUE WHERE id {IN(:ids, bigint)} AND state = 'running'

-- name: job_delete_ids
DELETE FROM conveyor_jobs WHERE id {IN(:ids, bigint)}

-- name: attempt_delete_ids
DELETE FROM conveyor_attempts WHERE job_id {IN(:ids, bigint)}

-- name: job_prune_count
SELECT count(*) AS n FROM conveyor_jobs j
WHERE j.state = :state AND j.finished_at < {NOW_MINUS(:older_than_s)}
  AND NOT (j.chain IS NOT NULL AND j.chain_next IS NULL)
  AND NOT EXISTS (SELECT 1 FROM conveyor_batches b WHERE b.id = j.batch_id AND b.state = 'running')

-- name: worker_delete
DELETE FROM conveyor_workers WHERE id = :id

-- name: worker_prune_stale
DELETE FROM conveyor_workers WHERE last_seen_at < {NOW_MINUS(:older_than_s)}

-- name: worker_request_stop
UPDATE conveyor_workers SET stop_requested = TRUE WHERE id = :id

-- name: worker_list
-- A keyset page on the primary key (MariaDB's tables are binary-collated, so ids
-- compare as they sort). :alive: 1 only workers heard from within :ttl_s, 0 only
-- the silent ones, -1 both.
SELECT w.*, (SELECT count(*) FROM conveyor_jobs j
             WHERE j.lease_owner = w.id AND j.state = 'running') AS held_jobs
FROM conveyor_workers w
WHERE w.id > :after_id
  AND (:alive < 0
       OR :alive = CASE WHEN w.last_seen_at >= {NOW_MINUS(:ttl_s)} THEN 1 ELSE 0 END)
ORDER BY w.id
LIMIT :limit

-- name: worker_count
-- The overview's tile: counted here, not by reading every worker's row.
SELECT count(CASE WHEN last_seen_at >= {NOW_MINUS(:ttl_s)} THEN 1 END) AS alive,
       count(*) AS total
FROM conveyor_workers

-- name: leader_get
SELECT holder FROM conveyor_leaders WHERE name = :name

-- name: leader_resign
DELETE FROM conveyor_leaders WHERE name = :name AND holder = :holder

-- name: queue_limits
SELECT name, max_running, keyed, rate_per_s, rate_burst FROM conveyor_queues
WHERE name {IN(:queues)}

-- name: queue_counts
-- The rollup (kept by triggers, see migration 11) and the deltas not folded yet:
-- exact, and never a scan of the jobs table.
SELECT queue, task, state, sum(n) AS n FROM (
    SELECT queue, task, state, n FROM conveyor_counts
    UNION ALL
    SELECT queue, task, state, n FROM conveyor_count_deltas
) c
GROUP BY queue, task, state
HAVING sum(n) <> 0
ORDER BY queue, task, state

-- name: counts_by_state
-- job_count for a filter on queue, task and state only: from the rollup.
SELECT state, sum(n) AS n FROM (
    SELECT queue, task, state, n FROM conveyor_counts
    UNION ALL
    SELECT queue, task, state, n FROM conveyor_count_deltas
) c
WHERE {FILTER}
GROUP BY state
HAVING sum(n) <> 0

-- name: counts_prune
DELETE FROM conveyor_counts WHERE n = 0

-- name: queue_oldest_waiting
-- Per queue that has jobs waiting: one descent of the waiting index, and the due
-- scheduled jobs the leader has not promoted yet (a few seconds' worth at most).
SELECT q.queue,
       (SELECT min(s) FROM (
            SELECT min(j.scheduled_at) AS s FROM conveyor_jobs j
            WHERE j.queue = q.queue AND j.state = 'available'
            UNION ALL
            SELECT min(j.scheduled_at) FROM conveyor_jobs j
            WHERE j.queue = q.queue AND j.state = 'scheduled' AND j.scheduled_at <= {NOW}
        ) w) AS since
FROM (SELECT DISTINCT queue FROM conveyor_counts
      WHERE state IN ('available', 'scheduled') AND n > 0
      UNION
      SELECT DISTINCT queue FROM conveyor_count_deltas
      WHERE state IN ('available', 'scheduled')) q

-- name: batch_count_open
SELECT count(*) AS n FROM conveyor_batches WHERE state = 'running'

-- name: batch_first_finished
SELECT min(finished_at) AS at FROM conveyor_jobs
WHERE batch_id = :id AND state IN ('succeeded', 'failed', 'cancelled')

-- name: job_count_capped
-- job_count for any other filter: a bounded read (the caller shows "cap+").
SELECT state, count(*) AS n FROM (
    SELECT state FROM conveyor_jobs WHERE {FILTER} LIMIT :cap
) s
GROUP BY state

-- name: batch_find_by_key
SELECT id FROM conveyor_batches WHERE idempotency_key = :idempotency_key

-- name: batch_get
-- With the state of its last callback job: a failed callback shows on the batch.
SELECT b.*, c.state AS callback_state FROM conveyor_batches b
LEFT JOIN conveyor_jobs c ON c.id = b.callback_job_id
WHERE b.id = :id

-- name: batch_list
SELECT b.*, c.state AS callback_state FROM conveyor_batches b
LEFT JOIN conveyor_jobs c ON c.id = b.callback_job_id
WHERE (:state = '' OR b.state = :state) AND b.id < :before_id
ORDER BY b.id DESC
LIMIT :limit

-- name: batch_progress
-- From the rollup the triggers keep (schema v16) and the deltas not folded yet:
-- exact, a few rows whatever the batch's size (no counters on the batch row).
SELECT state, sum(n) AS n FROM (
    SELECT state, n FROM conveyor_batch_counts WHERE batch_id = :id
    UNION ALL
    SELECT state, n FROM conveyor_batch_count_deltas WHERE batch_id = :id
) c
GROUP BY state
HAVING sum(n) <> 0

-- name: batch_finished_jobs
SELECT * FROM conveyor_jobs
WHERE batch_id = :id AND state IN ('succeeded', 'failed', 'cancelled')
  AND (finished_at > {TS(:after_at)} OR (finished_at = {TS(:after_at)} AND id > :after_id))
ORDER BY finished_at, id
LIMIT :limit

-- name: batch_jobs
SELECT * FROM conveyor_jobs WHERE batch_id = :id ORDER BY id

-- name: batch_mark_cancelled
UPDATE conveyor_batches SET cancelled_at = {NOW}, changed = {CHANGE}
WHERE id = :id AND state = 'running'

-- name: batch_cancel_jobs
UPDATE conveyor_jobs
SET state = 'cancelled', finished_at = {NOW}, error = 'cancelled with its batch',
    changed = {CHANGE}
WHERE batch_id = :id AND state IN ('scheduled', 'available')

-- name: batch_ready
SELECT b.id FROM conveyor_batches b
WHERE b.state = 'running'
  AND NOT EXISTS (SELECT 1 FROM conveyor_jobs j
                  WHERE j.batch_id = b.id AND j.state IN ('scheduled', 'available', 'running'))
ORDER BY b.id
LIMIT :limit

-- name: batch_lock_open
-- Row lock for the closing transaction: a second aggregator (a leader handover
-- overlap) waits here and then finds the batch closed.
SELECT * FROM conveyor_batches WHERE id = :id AND state = 'running' {FOR_UPDATE}

-- name: batch_mark_closed
UPDATE conveyor_batches
SET state = :state, counts = {JSON(:counts)}, closings = closings + 1, finished_at = {NOW},
    changed = {CHANGE}
WHERE id = :id AND state = 'running'

-- name: batch_set_callback
UPDATE conveyor_batches SET callback_job_id = :job_id WHERE id = :id

-- name: job_chain_get
SELECT chain FROM conveyor_jobs WHERE id = :id AND chain_next IS NULL {FOR_UPDATE}

-- name: job_chain_set
UPDATE conveyor_jobs SET chain = {JSON(:chain)} WHERE id = :id AND chain_next IS NULL

-- name: job_chain_due
-- Through the chain-due partial index: SQLite otherwise took the finished-jobs
-- index (v14) and sorted every finished job on each pass of the flow service.
SELECT id, state, result, error, chain, chain_root
FROM conveyor_jobs {INDEXED_BY(conveyor_jobs_chain_due_idx)}
WHERE chain IS NOT NULL AND chain_next IS NULL AND state IN ('succeeded', 'failed', 'cancelled')
ORDER BY id
LIMIT :limit

-- name: job_chain_lock
-- The step's link and state, locked until the link is written. The step must
-- still be in the state the linker read: an operator's retry between the read
-- and the link (failed -> available) must not have its rerun marked as the end.
SELECT chain_next, state FROM conveyor_jobs WHERE id = :id {FOR_UPDATE}

-- name: job_chain_link
-- 0 marks a chain that ended here (a failed or cancelled step).
UPDATE conveyor_jobs SET chain_next = :next_id WHERE id = :id AND chain_next IS NULL

-- name: periodic_first_seen
SELECT name, first_seen_at FROM conveyor_periodics WHERE name {IN(:names)}

-- The HTTP server's own storage (ServerStore): API tokens, per-task-type
-- settings, deadlines of jobs held by remote workers.

-- name: token_insert
INSERT INTO conveyor_tokens (id, name, scope, secret_hash, created_at)
VALUES (:id, :name, :scope, :secret_hash, {NOW})

-- name: token_get
SELECT * FROM conveyor_tokens WHERE id = :id

-- name: token_list
SELECT * FROM conveyor_tokens ORDER BY created_at, id

-- name: token_revoke
UPDATE conveyor_tokens SET revoked_at = {NOW} WHERE id = :id AND revoked_at IS NULL

-- name: token_count_active
SELECT count(*) AS n FROM conveyor_tokens WHERE revoked_at IS NULL

-- name: token_count_all
-- Revoked tokens stay as rows: this counts every token that ever existed.
SELECT count(*) AS n FROM conveyor_tokens

-- name: task_settings_list
SELECT * FROM conveyor_task_settings ORDER BY task

-- name: task_settings_get
SELECT * FROM conveyor_task_settings WHERE task = :task

-- name: task_settings_delete
DELETE FROM conveyor_task_settings WHERE task = :task

-- name: task_settings_apply
-- New settings reach the task's waiting jobs in the same transaction, so every
-- worker (in-process or remote) runs them with the new values from its next
-- claim. Options a job was sent with (its explicit bits: 1 max_attempts, 2
-- timeout, 4 backoff) are left alone, and so are fields the settings leave
-- unset (NULL). No index on task: a rare operator action may scan the waiting
-- jobs, where an index would cost every insert.
UPDATE conveyor_jobs
SET max_attempts = CASE WHEN explicit & 1 = 0 THEN coalesce(:max_attempts, max_attempts)
                        ELSE max_attempts END,
    timeout_s = CASE WHEN explicit & 2 = 0 THEN coalesce(:timeout_s, timeout_s)
                     ELSE timeout_s END,
    backoff = CASE WHEN explicit & 4 = 0 THEN coalesce({JSON(:backoff)}, backoff)
                   ELSE backoff END
WHERE task = :task AND state IN ('scheduled', 'available') AND explicit <> 7

-- name: job_set_deadline
-- A deadline of their own for jobs a remote client holds (the task's max
-- processing time): past it the job is rescued even while its worker still
-- heartbeats. Fenced by the lease token, like every write of a holder.
UPDATE conveyor_jobs SET lease_expires_at = {NOW_PLUS(:seconds)}
WHERE id {IN(:ids, bigint)} AND lease_token {IN(:tokens)} AND state = 'running'

-- Upserts: PostgreSQL and SQLite share ON CONFLICT; a dialect without it (MySQL:
-- ON DUPLICATE KEY UPDATE) overrides these.

-- name: batch_insert
-- ON CONFLICT on the idempotency key: a request seen before returns no row,
-- and the backend then returns the existing batch without inserting jobs.
INSERT INTO conveyor_batches (name, task, total, state, idempotency_key, fingerprint,
                              on_complete, created_at, changed)
VALUES (:name, :task, :total, 'running', :idempotency_key, :fingerprint, {JSON(:on_complete)},
        {NOW}, {CHANGE})
ON CONFLICT DO NOTHING
RETURNING id

-- name: leader_attempt_elect
-- Take the lease if it is free or expired, renew it if it is ours.
INSERT INTO conveyor_leaders (name, holder, expires_at)
VALUES (:name, :holder, {NOW_PLUS(:ttl_s)})
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE conveyor_leaders.holder = excluded.holder OR conveyor_leaders.expires_at < {NOW}

-- name: periodic_register
-- The first worker to see a schedule records when; later ones change nothing.
INSERT INTO conveyor_periodics (name, first_seen_at) VALUES (:name, {NOW})
ON CONFLICT (name) DO NOTHING

-- name: queue_set_paused
INSERT INTO conveyor_queues (name, paused, updated_at) VALUES (:name, :paused, {NOW})
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at

-- name: queue_set_limit
INSERT INTO conveyor_queues (name, max_running, updated_at) VALUES (:name, :max_running, {NOW})
ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running, updated_at = excluded.updated_at

-- name: queue_set_rate
INSERT INTO conveyor_queues (name, rate_per_s, rate_burst, updated_at)
VALUES (:name, :rate_per_s, :rate_burst, {NOW})
ON CONFLICT (name) DO UPDATE SET rate_per_s = excluded.rate_per_s,
    rate_burst = excluded.rate_burst, updated_at = excluded.updated_at

-- name: task_sensitive_list
SELECT task, name, position FROM conveyor_task_sensitive ORDER BY task, name

-- name: task_sensitive_upsert
INSERT INTO conveyor_task_sensitive (task, name, position) VALUES (:task, :name, :position)
ON CONFLICT (task, name) DO UPDATE SET position = excluded.position

-- name: task_settings_upsert
INSERT INTO conveyor_task_settings (task, batch_size, poll_interval_s, max_processing_s,
                                    max_attempts, retry_interval_s, retry_cap_s, updated_at)
VALUES (:task, :batch_size, :poll_interval_s, :max_processing_s, :max_attempts,
        :retry_interval_s, :retry_cap_s, {NOW})
ON CONFLICT (task) DO UPDATE SET batch_size = excluded.batch_size,
    poll_interval_s = excluded.poll_interval_s, max_processing_s = excluded.max_processing_s,
    max_attempts = excluded.max_attempts, retry_interval_s = excluded.retry_interval_s,
    retry_cap_s = excluded.retry_cap_s, updated_at = excluded.updated_at

-- Event streams: rows changed after a cursor, in change order. A change stamp is
-- written by every statement that changes a job's or a batch's state ({CHANGE});
-- reading stops at the horizon, before any transaction that may still commit, so
-- a client that resumes from an event id misses nothing and sees nothing twice.

-- name: changes_jobs
SELECT *, {CHANGE_TEXT(changed)} AS change_stamp FROM conveyor_jobs
WHERE {FILTER} AND {CHANGED_AFTER(changed, id, :after_change, :after_id)}
  AND {CHANGE_HORIZON(changed)}
ORDER BY changed, id
LIMIT :limit

-- name: changes_batches
SELECT b.*, c.state AS callback_state, {CHANGE_TEXT(b.changed)} AS change_stamp
FROM conveyor_batches b LEFT JOIN conveyor_jobs c ON c.id = b.callback_job_id
WHERE (:batch_id = 0 OR b.id = :batch_id)
  AND {CHANGED_AFTER(b.changed, b.id, :after_change, :after_id)}
  AND {CHANGE_HORIZON(b.changed)}
ORDER BY b.changed, b.id
LIMIT :limit

-- Bulk actions run in the background and their audit record (schema v13).

-- name: action_insert
INSERT INTO conveyor_actions (id, action, filter, actor, matched, state, created_at)
VALUES (:id, :action, :filter, :actor, :matched, 'running', {NOW})

-- name: action_update
UPDATE conveyor_actions
SET done = :done, requested = :requested, state = :state, error = :error,
    finished_at = CASE WHEN :state = 'running' THEN NULL ELSE {NOW} END
WHERE id = :id

-- name: action_list
SELECT * FROM conveyor_actions ORDER BY created_at DESC, id DESC LIMIT :limit

-- name: action_get
SELECT * FROM conveyor_actions WHERE id = :id

-- Workflows (schema v23). The flow leader settles a finished node's job in one
-- transaction: the workflow row locked first (a cancel or a retry locks it too),
-- then the job's chain link, then the node rows it changes.

-- name: workflow_insert
INSERT INTO conveyor_workflows (name, state, idempotency_key, fingerprint, total, open_nodes,
                                created_at, updated_at)
VALUES (:name, 'running', :idempotency_key, :fingerprint, :total, :total, {NOW}, {NOW})
ON CONFLICT DO NOTHING
RETURNING id

-- name: workflow_find_by_key
SELECT id FROM conveyor_workflows WHERE idempotency_key = :idempotency_key

-- name: workflow_get
SELECT * FROM conveyor_workflows WHERE id = :id

-- name: workflow_lock
SELECT * FROM conveyor_workflows WHERE id = :id {FOR_UPDATE}

-- name: workflow_list
SELECT * FROM conveyor_workflows
WHERE (:state = '' OR state = :state) AND id < :before_id
ORDER BY id DESC
LIMIT :limit

-- name: workflow_update
UPDATE conveyor_workflows
SET state = :state, open_nodes = :open_nodes, failures = :failures, round = :round,
    error = :error, updated_at = {NOW}, finished_at = {TS(:finished_at)},
    cancelled_at = {TS(:cancelled_at)}
WHERE id = :id

-- name: workflow_node_insert
INSERT INTO conveyor_workflow_nodes (workflow_id, node, item, name, kind, step, parents, children,
                                     over_node, on_parent_failure, waiting, state, job_id, items,
                                     result, error, round, updated_at, finished_at)
VALUES (:workflow_id, :node, :item, :name, :kind, {JSON(:step)}, {JSON(:parents)},
        {JSON(:children)}, :over_node, :on_parent_failure, :waiting, :state, :job_id, :items,
        {JSON(:result)}, :error, :round, {NOW}, {TS(:finished_at)})

-- name: workflow_node_update
UPDATE conveyor_workflow_nodes
SET waiting = :waiting, state = :state, job_id = :job_id, items = :items,
    result = {JSON(:result)}, error = :error, round = :round, updated_at = {NOW},
    finished_at = {TS(:finished_at)}
WHERE workflow_id = :workflow_id AND node = :node AND item = :item

-- name: workflow_nodes
SELECT * FROM conveyor_workflow_nodes WHERE workflow_id = :id AND item = -1 ORDER BY node

-- name: workflow_node_get
SELECT * FROM conveyor_workflow_nodes WHERE workflow_id = :id AND node = :node AND item = :item

-- name: workflow_nodes_in
SELECT * FROM conveyor_workflow_nodes
WHERE workflow_id = :id AND item = -1 AND node {IN(:nodes, integer)}

-- name: workflow_items
SELECT * FROM conveyor_workflow_nodes WHERE workflow_id = :id AND node = :node AND item >= 0
ORDER BY item

-- name: workflow_item_counts
SELECT state, count(*) AS n FROM conveyor_workflow_nodes
WHERE workflow_id = :id AND node = :node AND item >= 0
GROUP BY state

-- name: workflow_items_delete
DELETE FROM conveyor_workflow_nodes WHERE workflow_id = :id AND node = :node AND item >= 0

-- name: workflow_nodes_by_jobs
SELECT * FROM conveyor_workflow_nodes WHERE job_id {IN(:ids, bigint)}

-- name: workflow_jobs_lock
-- The finished jobs a settling pass records, locked in id order (as every pass
-- takes them): a second pass (a leadership overlap) waits, then finds them linked.
SELECT id, chain_next, state FROM conveyor_jobs WHERE id {IN(:ids, bigint)} ORDER BY id {FOR_UPDATE}

-- name: workflow_jobs_link
UPDATE conveyor_jobs SET chain_next = 0 WHERE id {IN(:ids, bigint)} AND chain_next IS NULL

-- name: workflow_running_jobs
SELECT job_id FROM conveyor_workflow_nodes
WHERE workflow_id = :id AND state = 'running' AND job_id IS NOT NULL

-- name: workflow_prune_ids
-- Workflows that ended in this state longer ago than its retention (their jobs
-- go by the jobs' own retention: a node's result is kept in its row).
SELECT id FROM conveyor_workflows
WHERE state = :state AND finished_at < {NOW_MINUS(:older_than_s)}
ORDER BY id
LIMIT :limit

-- name: workflow_nodes_delete_ids
DELETE FROM conveyor_workflow_nodes WHERE workflow_id {IN(:ids, bigint)}

-- name: workflow_delete_ids
DELETE FROM conveyor_workflows WHERE id {IN(:ids, bigint)}

-- name: workflow_cancel_jobs
UPDATE conveyor_jobs
SET state = 'cancelled', finished_at = {NOW}, error = 'cancelled with its workflow',
    changed = {CHANGE}
WHERE id {IN(:ids, bigint)} AND state IN ('scheduled', 'available')
-- Durable steps inside one job, and the events they wait for (schema v24).

-- name: job_lease_held
-- Fencing of a step's write, as of an outcome's: only the attempt that holds
-- the job (its lease token, still running) writes; the row stays locked until
-- the write commits, so a rescue or a cancel waits for it, and a write after
-- them finds the lease gone.
SELECT id FROM conveyor_jobs WHERE id = :id AND lease_token = :token AND state = 'running'
{FOR_UPDATE}

-- name: step_list
SELECT name, kind, result, done, timed_out, event_key,
       CASE WHEN wake_at IS NULL THEN NULL ELSE -{SECONDS_SINCE(wake_at)} END AS due_in_s
FROM conveyor_job_steps WHERE job_id = :job_id ORDER BY created_at, name

-- name: step_get
SELECT name, kind, result, done, timed_out, event_key,
       CASE WHEN wake_at IS NULL THEN NULL ELSE -{SECONDS_SINCE(wake_at)} END AS due_in_s
FROM conveyor_job_steps WHERE job_id = :job_id AND name = :name

-- name: step_resolve_wait
-- The wait's outcome, once known: the event's payload, or its deadline passed.
UPDATE conveyor_job_steps SET done = TRUE, result = :result, timed_out = :timed_out
WHERE job_id = :job_id AND name = :name AND NOT done

-- name: step_delete_ids
DELETE FROM conveyor_job_steps WHERE job_id {IN(:ids, bigint)}

-- name: step_orphans
-- Steps whose job is gone without a row delete of ours (a dropped day partition
-- of finished jobs, PostgreSQL and MariaDB): the maintenance sweep removes them.
SELECT DISTINCT s.job_id FROM conveyor_job_steps s
WHERE NOT EXISTS (SELECT 1 FROM conveyor_jobs j WHERE j.id = s.job_id)
LIMIT :limit

-- name: event_get
SELECT event_key, payload FROM conveyor_events WHERE event_key = :key

-- name: job_waiters_due
-- Scheduled jobs with an open wait whose event exists (:key NULL: any key): the
-- ones an emit, or the leader's pass after it, makes available now.
SELECT j.id, j.queue FROM conveyor_jobs j
WHERE j.state = 'scheduled'
  AND j.id IN (SELECT s.job_id FROM conveyor_job_steps s
               JOIN conveyor_events e ON e.event_key = s.event_key
               WHERE s.kind = 'wait' AND NOT s.done
                 AND s.event_key = coalesce(:key, s.event_key))
ORDER BY j.id
LIMIT :limit
{FOR_UPDATE}

-- name: job_wake_ids
UPDATE conveyor_jobs SET state = 'available', scheduled_at = {NOW}, changed = {CHANGE}
WHERE id {IN(:ids, bigint)} AND state = 'scheduled'

-- name: event_prune
-- Events older than the retention, a bounded batch at a time.
DELETE FROM conveyor_events WHERE event_key IN (
    SELECT event_key FROM conveyor_events WHERE created_at < {NOW_MINUS(:older_than_s)}
    ORDER BY created_at LIMIT :limit)

-- name: step_insert
-- The first write of a step's name wins: a second one (the same name run twice in
-- one attempt, or a later attempt's) changes nothing, and the writer reads the
-- stored row back. wake_at is NULL when :wake_in_s is (NULL seconds from now).
INSERT INTO conveyor_job_steps (job_id, name, kind, result, done, timed_out, wake_at,
                                event_key, created_at)
VALUES (:job_id, :name, :kind, :result, :done, FALSE,
        {NOW_PLUS(:wake_in_s)},
        :event_key, {NOW})
ON CONFLICT (job_id, name) DO NOTHING

-- name: event_insert
-- The first payload for a key wins; a later emit changes nothing (rowcount 0).
INSERT INTO conveyor_events (event_key, payload, created_at) VALUES (:key, :payload, {NOW})
ON CONFLICT (event_key) DO NOTHING
