-- Schema v17: the job table is partitioned, so finished jobs leave the hot table
-- and retention drops whole partitions instead of deleting rows.
--
--   conveyor_jobs                  PARTITION BY LIST (state)
--     conveyor_jobs_live           scheduled, available, running: every claim,
--                                  heartbeat and outcome works here, and it
--                                  holds only the work not yet done
--     conveyor_jobs_succeeded      PARTITION BY RANGE (finished_at), one per day
--     conveyor_jobs_failed           (conveyor_jobs_<state>_YYYYMMDD, UTC days,
--     conveyor_jobs_cancelled         made a few days ahead by the leader), the
--                                     jobs finished before the upgrade
--                                     (conveyor_jobs_<state>_before_YYYYMMDD) and
--                                     a catch-all conveyor_jobs_<state>_rest
--
-- An outcome moves its row from the live partition to its state's day (an UPDATE
-- that changes the partition key: PostgreSQL deletes and inserts it; the
-- statement-level count triggers see it as the update it is). Retention drops a
-- day once all of it is older than the state's retention (conveyor_jobs_drop_day).
-- Every job is kept: the rows are copied from the v16 table, ids and all.
--
-- What the partitioning changes:
-- * id is no longer a primary key (a unique index on a partitioned table must
--   hold its partition key); ids still come from one sequence, and every
--   partition has an index on id.
-- * unique_key (one unfinished job per key) is a unique index on the live
--   partition, which holds exactly the unfinished jobs.
-- * idempotency_key (one job per key, as long as the job is kept) is a unique
--   index on each partition; across partitions the insert locks any job that
--   holds the key (FOR KEY SHARE) and leaves its key out, so a job that finishes
--   while a duplicate is being sent cannot slip past (job_insert_many).

-- The old table's index and constraint names are freed for the new table.
DROP INDEX conveyor_jobs_batch_idx, conveyor_jobs_chain_due_idx, conveyor_jobs_changed_idx,
    conveyor_jobs_due_idx, conveyor_jobs_due_queue_idx, conveyor_jobs_fetch_idx,
    conveyor_jobs_finished_idx, conveyor_jobs_idempotency_key_idx, conveyor_jobs_lease_idx,
    conveyor_jobs_owner_idx, conveyor_jobs_problem_idx, conveyor_jobs_running_key_idx,
    conveyor_jobs_spread_idx, conveyor_jobs_tenant_idx, conveyor_jobs_unique_key_idx,
    conveyor_jobs_waiting_idx;
ALTER TABLE conveyor_jobs DROP CONSTRAINT conveyor_jobs_pkey;
ALTER SEQUENCE conveyor_jobs_id_seq OWNED BY NONE;
ALTER TABLE conveyor_jobs RENAME TO conveyor_jobs_v16;

CREATE TABLE conveyor_jobs (LIKE conveyor_jobs_v16 INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY LIST (state);
ALTER SEQUENCE conveyor_jobs_id_seq OWNED BY conveyor_jobs.id;

CREATE TABLE conveyor_jobs_live PARTITION OF conveyor_jobs
    FOR VALUES IN ('scheduled', 'available', 'running');
CREATE TABLE conveyor_jobs_succeeded PARTITION OF conveyor_jobs
    FOR VALUES IN ('succeeded') PARTITION BY RANGE (finished_at);
CREATE TABLE conveyor_jobs_failed PARTITION OF conveyor_jobs
    FOR VALUES IN ('failed') PARTITION BY RANGE (finished_at);
CREATE TABLE conveyor_jobs_cancelled PARTITION OF conveyor_jobs
    FOR VALUES IN ('cancelled') PARTITION BY RANGE (finished_at);
CREATE TABLE conveyor_jobs_succeeded_rest PARTITION OF conveyor_jobs_succeeded DEFAULT;
CREATE TABLE conveyor_jobs_failed_rest PARTITION OF conveyor_jobs_failed DEFAULT;
CREATE TABLE conveyor_jobs_cancelled_rest PARTITION OF conveyor_jobs_cancelled DEFAULT;

-- On every partition (those made later too).
CREATE INDEX conveyor_jobs_batch_idx ON conveyor_jobs (batch_id, state) WHERE batch_id IS NOT NULL;
CREATE INDEX conveyor_jobs_changed_idx ON conveyor_jobs (changed, id) WHERE changed IS NOT NULL;
CREATE INDEX conveyor_jobs_spread_idx ON conveyor_jobs (spread_group) WHERE spread_group IS NOT NULL;
CREATE INDEX conveyor_jobs_tenant_idx ON conveyor_jobs (tenant, id) WHERE tenant IS NOT NULL;
-- Finished jobs only: nothing is written to them in the live partition.
CREATE INDEX conveyor_jobs_finished_idx ON conveyor_jobs (state, finished_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX conveyor_jobs_problem_idx ON conveyor_jobs (state, id)
    WHERE state IN ('failed', 'cancelled');
CREATE INDEX conveyor_jobs_chain_due_idx ON conveyor_jobs (id)
    WHERE chain IS NOT NULL AND chain_next IS NULL AND state IN ('succeeded', 'failed', 'cancelled');

-- Unique in each partition (a partitioned table cannot have them): id and
-- idempotency_key, here and in every day conveyor_jobs_add_days makes.
CREATE FUNCTION conveyor_jobs_index_part(part text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE UNIQUE INDEX %I ON %I (id)', part || '_id_key', part);
    EXECUTE format('CREATE UNIQUE INDEX %I ON %I (idempotency_key) '
                   'WHERE idempotency_key IS NOT NULL', part || '_idempotency_key', part);
END
$$;
SELECT conveyor_jobs_index_part(p) FROM unnest(ARRAY['conveyor_jobs_live',
    'conveyor_jobs_succeeded_rest', 'conveyor_jobs_failed_rest', 'conveyor_jobs_cancelled_rest']) p;

-- The live partition's own (the same definitions as in v16).
CREATE UNIQUE INDEX conveyor_jobs_unique_key_idx ON conveyor_jobs_live (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('scheduled', 'available', 'running');
CREATE INDEX conveyor_jobs_fetch_idx ON conveyor_jobs_live (queue, priority DESC, scheduled_at, id)
    WHERE state IN ('available', 'scheduled');
CREATE INDEX conveyor_jobs_lease_idx ON conveyor_jobs_live (lease_expires_at)
    WHERE state = 'running' AND lease_expires_at IS NOT NULL;
CREATE INDEX conveyor_jobs_owner_idx ON conveyor_jobs_live (lease_owner) WHERE state = 'running';
CREATE INDEX conveyor_jobs_running_key_idx ON conveyor_jobs_live (concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;
CREATE INDEX conveyor_jobs_waiting_idx ON conveyor_jobs_live (queue, scheduled_at, id)
    WHERE state = 'available';
CREATE INDEX conveyor_jobs_due_idx ON conveyor_jobs_live (scheduled_at) WHERE state = 'scheduled';
CREATE INDEX conveyor_jobs_due_queue_idx ON conveyor_jobs_live (queue, scheduled_at)
    WHERE state = 'scheduled';

-- The days of finished jobs, from today (UTC) to `ahead` days on. A day whose
-- jobs already sit in its state's catch-all (written before the day was made)
-- stays there: PostgreSQL would refuse the new partition.
CREATE FUNCTION conveyor_jobs_add_days(ahead integer) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    s text;
    d date;
    lo timestamptz;
    hi timestamptz;
    part text;
    taken boolean;
    made integer := 0;
BEGIN
    FOREACH s IN ARRAY ARRAY['succeeded', 'failed', 'cancelled'] LOOP
        FOR i IN 0..ahead LOOP
            d := (now() AT TIME ZONE 'UTC')::date + i;
            part := format('conveyor_jobs_%s_%s', s, to_char(d, 'YYYYMMDD'));
            CONTINUE WHEN to_regclass(quote_ident(part)) IS NOT NULL;
            lo := d::timestamp AT TIME ZONE 'UTC';
            hi := (d + 1)::timestamp AT TIME ZONE 'UTC';
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE state = %L '
                           'AND finished_at >= $1 AND finished_at < $2)',
                           'conveyor_jobs_' || s || '_rest', s)
                INTO taken USING lo, hi;
            CONTINUE WHEN taken;
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                           part, 'conveyor_jobs_' || s, lo, hi);
            PERFORM conveyor_jobs_index_part(part);
            made := made + 1;
        END LOOP;
    END LOOP;
    RETURN made;
END
$$;

-- Retention by whole days: drop each day of `st` that ended before `cutoff`,
-- unless it holds a job of an open batch or a chain link not yet advanced (as
-- row by row retention would keep them). The rows leave without DELETE triggers,
-- so their counts are taken out here, and their attempts deleted. Returns how
-- many jobs went. The caller sets a lock timeout: a day is dropped under an
-- exclusive lock on its state's partition, held for the drop only.
CREATE FUNCTION conveyor_jobs_drop_days(st text, cutoff timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    part text;
    hi timestamptz;
    kept boolean;
    n bigint;
    gone bigint := 0;
BEGIN
    IF st NOT IN ('succeeded', 'failed', 'cancelled') THEN
        RAISE EXCEPTION 'not a finished state: %', st;
    END IF;
    FOR part IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = to_regclass(quote_ident('conveyor_jobs_' || st))
          AND c.relname ~ ('^conveyor_jobs_' || st || '_(before_)?[0-9]{8}$')
        ORDER BY c.relname
    LOOP
        -- a day ends at the next midnight; the jobs from before the upgrade, at its
        hi := (to_date(right(part, 8), 'YYYYMMDD')
               + CASE WHEN part LIKE '%\_before\_%' THEN 0 ELSE 1 END)::timestamp AT TIME ZONE 'UTC';
        CONTINUE WHEN hi > cutoff;
        EXECUTE format('LOCK TABLE ONLY %I IN ACCESS EXCLUSIVE MODE', 'conveyor_jobs_' || st);
        EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', part);
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I j WHERE j.chain IS NOT NULL '
                       'AND j.chain_next IS NULL) OR EXISTS (SELECT 1 FROM %I j '
                       'JOIN conveyor_batches b ON b.id = j.batch_id WHERE b.state = ''running'')',
                       part, part) INTO kept;
        CONTINUE WHEN kept;
        EXECUTE format('WITH c AS (INSERT INTO conveyor_count_deltas (queue, task, state, n) '
                       'SELECT queue, task, state, -count(*) FROM %I GROUP BY queue, task, state '
                       'RETURNING n) SELECT coalesce(-sum(n), 0) FROM c', part) INTO n;
        EXECUTE format('INSERT INTO conveyor_batch_count_deltas (batch_id, state, n) '
                       'SELECT batch_id, state, -count(*) FROM %I WHERE batch_id IS NOT NULL '
                       'GROUP BY batch_id, state', part);
        EXECUTE format('DELETE FROM conveyor_attempts a USING %I j WHERE a.job_id = j.id', part);
        EXECUTE format('DROP TABLE %I', part);
        gone := gone + n;
    END LOOP;
    RETURN gone;
END
$$;

SELECT conveyor_jobs_add_days(2);
-- The jobs finished before today go to one partition per state of their own
-- (conveyor_jobs_<state>_before_YYYYMMDD), dropped whole once all of it is past
-- retention, row by row until then. Not to the catch-all: PostgreSQL scans a
-- default partition for rows of every day made later, under a lock that holds
-- back that state's outcomes, so the catch-all must stay small.
DO $$
DECLARE
    s text;
    today timestamptz := (now() AT TIME ZONE 'UTC')::date::timestamp AT TIME ZONE 'UTC';
    part text;
BEGIN
    FOREACH s IN ARRAY ARRAY['succeeded', 'failed', 'cancelled'] LOOP
        part := format('conveyor_jobs_%s_before_%s', s, to_char(today AT TIME ZONE 'UTC', 'YYYYMMDD'));
        EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (MINVALUE) TO (%L)',
                       part, 'conveyor_jobs_' || s, today);
        PERFORM conveyor_jobs_index_part(part);
    END LOOP;
END
$$;

INSERT INTO conveyor_jobs SELECT * FROM conveyor_jobs_v16;
DROP TABLE conveyor_jobs_v16;

-- The counts' triggers, on the partitioned table (v11, v16): the rows are already
-- counted, so they start only now.
CREATE TRIGGER conveyor_count_insert AFTER INSERT ON conveyor_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION conveyor_count_rows();
CREATE TRIGGER conveyor_count_update AFTER UPDATE ON conveyor_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_count_rows();
CREATE TRIGGER conveyor_count_delete AFTER DELETE ON conveyor_jobs
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION conveyor_count_rows();
CREATE TRIGGER conveyor_batch_count_insert AFTER INSERT ON conveyor_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_batch_count_rows();
CREATE TRIGGER conveyor_batch_count_update AFTER UPDATE ON conveyor_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_batch_count_rows();
CREATE TRIGGER conveyor_batch_count_delete AFTER DELETE ON conveyor_jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_batch_count_rows();

ANALYZE conveyor_jobs;
