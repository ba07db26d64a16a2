-- Schema v22: the job table is partitioned as PostgreSQL's is (its v17), so
-- finished jobs leave the hot part of the table and retention drops whole days
-- instead of deleting rows.
--
--   PARTITION BY RANGE (part), where part is
--     0                                  scheduled, available, running: the
--                                        partition `live`, where every claim,
--                                        heartbeat and outcome works
--     k * 1000000 + TO_DAYS(finished)    a finished job, k = 1 succeeded,
--                                        2 failed, 3 cancelled: one partition
--                                        per state and UTC day (<state>_YYYYMMDD,
--                                        made a few days ahead by the leader),
--                                        the jobs finished before the upgrade
--                                        (<state>_before_YYYYMMDD) and a
--                                        catch-all <state>_rest
--
-- part is a plain column kept by BEFORE triggers: MariaDB refuses a generated
-- column in a primary key, and every unique key of a partitioned table must
-- hold its partitioning column. An outcome moves its row from `live` to its
-- state's day (an UPDATE that changes part; the row triggers see an update).
--
-- What the partitioning changes (MariaDB: a unique key must hold part, and a
-- partitioned InnoDB table has no foreign keys; conveyor_jobs has none, nor
-- does any table point at it):
-- * the primary key is (id, part); ids still come from AUTO_INCREMENT.
-- * unique_key (one unfinished job per key): (unique_key_active, part); the
--   generated column is NULL once the job is finished, so every non-NULL value
--   is in `live` (part 0): the same guarantee as before.
-- * idempotency_key (one job per key, as long as the job is kept): unique per
--   partition, and across partitions by conveyor_job_keys (one row per key,
--   written by the insert's own trigger, in its transaction). A BEFORE INSERT
--   trigger finds the job that holds the key, locks it (so it cannot move until
--   the insert commits) and gives the new row that job's id and part: INSERT
--   IGNORE then skips it as a duplicate of the primary key, as it skipped a
--   duplicate of the unique index before (a trigger's own error would fail the
--   whole statement, IGNORE or not).
-- * retention (conveyor_jobs_drop_days): a day is moved out whole by EXCHANGE
--   PARTITION into conveyor_jobs_dropped (same columns, not partitioned), its
--   counts, attempts and keys taken out there, then the empty partition dropped.
--   A later migration that changes conveyor_jobs must change that table too.
-- Every job is kept, ids and all: the table is altered in place (one copy,
-- writes wait for it).

ALTER TABLE conveyor_jobs ADD COLUMN part integer NOT NULL DEFAULT 0;

CREATE TABLE conveyor_job_keys (
    idempotency_key varchar(512) NOT NULL PRIMARY KEY,
    job_id          bigint       NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- part from the row's state and finish time (a finished job always has one;
-- created_at only guards the partition function against a NULL).
CREATE TRIGGER conveyor_jobs_part_update BEFORE UPDATE ON conveyor_jobs FOR EACH ROW
SET NEW.part = IF(NEW.state IN ('succeeded', 'failed', 'cancelled'),
                  FIELD(NEW.state, 'succeeded', 'failed', 'cancelled') * 1000000
                  + TO_DAYS(COALESCE(NEW.finished_at, NEW.created_at)), 0);

CREATE TRIGGER conveyor_jobs_part_insert BEFORE INSERT ON conveyor_jobs FOR EACH ROW
BEGIN
    DECLARE held_id bigint DEFAULT NULL;
    DECLARE held_part integer DEFAULT NULL;
    SET NEW.part = IF(NEW.state IN ('succeeded', 'failed', 'cancelled'),
                      FIELD(NEW.state, 'succeeded', 'failed', 'cancelled') * 1000000
                      + TO_DAYS(COALESCE(NEW.finished_at, NEW.created_at)), 0);
    IF NEW.idempotency_key IS NOT NULL THEN
        SELECT j.id, j.part INTO held_id, held_part
        FROM conveyor_job_keys k JOIN conveyor_jobs j ON j.id = k.job_id
        WHERE k.idempotency_key = NEW.idempotency_key
        LIMIT 1
        LOCK IN SHARE MODE;
        IF held_id IS NOT NULL THEN
            SET NEW.id = held_id, NEW.part = held_part;
        END IF;
    END IF;
END;

CREATE TRIGGER conveyor_jobs_key_insert AFTER INSERT ON conveyor_jobs FOR EACH ROW
BEGIN
    IF NEW.idempotency_key IS NOT NULL THEN
        INSERT INTO conveyor_job_keys (idempotency_key, job_id)
        VALUES (NEW.idempotency_key, NEW.id)
        ON DUPLICATE KEY UPDATE job_id = NEW.id;
    END IF;
END;

CREATE TRIGGER conveyor_jobs_key_delete AFTER DELETE ON conveyor_jobs FOR EACH ROW
DELETE FROM conveyor_job_keys
WHERE idempotency_key = OLD.idempotency_key AND job_id = OLD.id;

-- The keys of the jobs already there (the old unique index still holds until
-- the ALTER below), and part for the finished ones (their counts do not move:
-- the state is unchanged).
INSERT IGNORE INTO conveyor_job_keys (idempotency_key, job_id)
SELECT idempotency_key, id FROM conveyor_jobs WHERE idempotency_key IS NOT NULL;
UPDATE conveyor_jobs SET part = 0 WHERE state IN ('succeeded', 'failed', 'cancelled');

-- One ALTER (one copy): the keys with part, and the partitions: live, then per
-- state the jobs finished before today, and a catch-all that the days split.
-- chain_due_state keeps its values, written without AND: MariaDB 10.11 refuses
-- EXCHANGE PARTITION ("Tables have different definitions") when a generated
-- column's expression holds an AND.
SET @conveyor_sql = (
    SELECT CONCAT(
        'ALTER TABLE conveyor_jobs DROP PRIMARY KEY, ADD PRIMARY KEY (id, part), ',
        'MODIFY COLUMN chain_due_state varchar(16) AS (CASE WHEN chain IS NULL THEN NULL ',
        'WHEN chain_next IS NULL THEN state END) STORED, ',
        'DROP KEY conveyor_jobs_unique_key_idx, ',
        'ADD UNIQUE KEY conveyor_jobs_unique_key_idx (unique_key_active, part), ',
        'DROP KEY conveyor_jobs_idempotency_key_idx, ',
        'ADD UNIQUE KEY conveyor_jobs_idempotency_key_idx (idempotency_key, part) ',
        'PARTITION BY RANGE (part) (PARTITION live VALUES LESS THAN (1), ',
        GROUP_CONCAT(CONCAT(
            'PARTITION ', s.name, '_before_', DATE_FORMAT(UTC_DATE(), '%Y%m%d'),
            ' VALUES LESS THAN (', s.k * 1000000 + TO_DAYS(UTC_DATE()), '), ',
            'PARTITION ', s.name, '_rest VALUES LESS THAN (',
            IF(s.k = 3, 'MAXVALUE', (s.k + 1) * 1000000), ')')
            ORDER BY s.k SEPARATOR ', '),
        ')')
    FROM (SELECT 1 AS k, 'succeeded' AS name UNION ALL SELECT 2, 'failed'
          UNION ALL SELECT 3, 'cancelled') s
);
PREPARE conveyor_stmt FROM @conveyor_sql;
EXECUTE conveyor_stmt;
DEALLOCATE PREPARE conveyor_stmt;
SET @conveyor_sql = NULL;

-- Where a dropped day's rows go first (EXCHANGE PARTITION wants a table of the
-- same columns and keys, not partitioned).
CREATE TABLE conveyor_jobs_dropped LIKE conveyor_jobs;
ALTER TABLE conveyor_jobs_dropped REMOVE PARTITIONING;

-- The days of finished jobs, from today (UTC) to `ahead` days on: each splits
-- its state's catch-all (REORGANIZE: a copy of the catch-all's rows, which are
-- few when the days are made ahead). A day at or before the state's last one
-- is left alone. @conveyor_days: how many were made.
CREATE PROCEDURE conveyor_jobs_add_days(IN ahead integer)
BEGIN
    DECLARE k integer DEFAULT 1;
    DECLARE i integer;
    DECLARE st varchar(16);
    DECLARE bound bigint;
    DECLARE last_bound bigint;
    SET @conveyor_days = 0;
    WHILE k <= 3 DO
        SET st = ELT(k, 'succeeded', 'failed', 'cancelled');
        SELECT MAX(CAST(p.PARTITION_DESCRIPTION AS SIGNED)) INTO last_bound
        FROM information_schema.PARTITIONS p
        WHERE p.TABLE_SCHEMA = DATABASE() AND p.TABLE_NAME = 'conveyor_jobs'
          AND p.PARTITION_NAME LIKE CONCAT(st, '\_%') AND p.PARTITION_NAME <> CONCAT(st, '_rest');
        SET i = 0;
        WHILE i <= ahead DO
            SET bound = k * 1000000 + TO_DAYS(UTC_DATE() + INTERVAL i DAY) + 1;
            IF bound > COALESCE(last_bound, 0) THEN
                SET @conveyor_sql = CONCAT(
                    'ALTER TABLE conveyor_jobs REORGANIZE PARTITION ', st, '_rest INTO (',
                    'PARTITION ', st, '_', DATE_FORMAT(UTC_DATE() + INTERVAL i DAY, '%Y%m%d'),
                    ' VALUES LESS THAN (', bound, '), PARTITION ', st, '_rest VALUES LESS THAN (',
                    IF(k = 3, 'MAXVALUE', (k + 1) * 1000000), '))');
                PREPARE conveyor_stmt FROM @conveyor_sql;
                EXECUTE conveyor_stmt;
                DEALLOCATE PREPARE conveyor_stmt;
                SET last_bound = bound, @conveyor_days = @conveyor_days + 1;
            END IF;
            SET i = i + 1;
        END WHILE;
        SET k = k + 1;
    END WHILE;
END;

-- The rows of a day moved out into conveyor_jobs_dropped leave without DELETE
-- triggers: their counts and their batches' counts are taken out, and their
-- attempts and keys deleted, in one transaction, which also marks the table done
-- (a row 'dropped' in conveyor_locks); the table is then emptied. Called again
-- after a crash between the two, it finishes the work without counting twice.
-- Adds the jobs it took out to @conveyor_gone.
CREATE PROCEDURE conveyor_jobs_forget_dropped()
BEGIN
    START TRANSACTION;
    IF NOT EXISTS (SELECT 1 FROM conveyor_locks WHERE name = 'dropped')
       AND EXISTS (SELECT 1 FROM conveyor_jobs_dropped) THEN
        INSERT INTO conveyor_count_deltas (queue, task, state, n)
        SELECT queue, task, state, -count(*) FROM conveyor_jobs_dropped
        GROUP BY queue, task, state;
        INSERT INTO conveyor_batch_count_deltas (batch_id, state, n)
        SELECT batch_id, state, -count(*) FROM conveyor_jobs_dropped
        WHERE batch_id IS NOT NULL GROUP BY batch_id, state;
        DELETE a FROM conveyor_attempts a JOIN conveyor_jobs_dropped j ON a.job_id = j.id;
        DELETE k FROM conveyor_job_keys k
        JOIN conveyor_jobs_dropped j ON k.idempotency_key = j.idempotency_key AND k.job_id = j.id;
        SET @conveyor_gone = COALESCE(@conveyor_gone, 0)
                             + (SELECT count(*) FROM conveyor_jobs_dropped);
        INSERT INTO conveyor_locks (name) VALUES ('dropped');
    END IF;
    COMMIT;
    TRUNCATE TABLE conveyor_jobs_dropped;
    DELETE FROM conveyor_locks WHERE name = 'dropped';
END;

-- Retention by whole days: each day of `st` (and the jobs from before the
-- upgrade) that ended at or before `cutoff` goes, unless it holds a job of an
-- open batch or a chain link not yet advanced (row by row retention keeps
-- those; it takes the day's other jobs). @conveyor_gone: how many jobs went.
-- The caller sets a short lock_wait_timeout: each ALTER waits for the
-- transactions that use the table, and the ones after it wait behind it.
CREATE PROCEDURE conveyor_jobs_drop_days(IN st varchar(16), IN cutoff datetime(6))
BEGIN
    DECLARE k integer DEFAULT FIELD(st, 'succeeded', 'failed', 'cancelled');
    DECLARE pos bigint DEFAULT 0;
    DECLARE day_name varchar(64);
    SET @conveyor_gone = 0;
    IF k = 0 THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'not a finished state';
    END IF;
    CALL conveyor_jobs_forget_dropped();
    dropping: LOOP
        SET day_name = NULL;
        SELECT p.PARTITION_NAME, p.PARTITION_ORDINAL_POSITION INTO day_name, pos
        FROM information_schema.PARTITIONS p
        WHERE p.TABLE_SCHEMA = DATABASE() AND p.TABLE_NAME = 'conveyor_jobs'
          AND p.PARTITION_NAME LIKE CONCAT(st, '\_%') AND p.PARTITION_NAME <> CONCAT(st, '_rest')
          AND CAST(p.PARTITION_DESCRIPTION AS SIGNED) - k * 1000000 <= TO_DAYS(cutoff)
          AND p.PARTITION_ORDINAL_POSITION > pos
        ORDER BY p.PARTITION_ORDINAL_POSITION
        LIMIT 1;
        IF day_name IS NULL THEN
            LEAVE dropping;
        END IF;
        SET @conveyor_sql = CONCAT(
            'SELECT EXISTS (SELECT 1 FROM conveyor_jobs PARTITION (', day_name, ') j ',
            'WHERE j.chain_due_state IS NOT NULL) OR EXISTS (SELECT 1 FROM conveyor_jobs ',
            'PARTITION (', day_name, ') j JOIN conveyor_batches b ON b.id = j.batch_id ',
            'WHERE b.state = ''running'') INTO @conveyor_kept');
        PREPARE conveyor_stmt FROM @conveyor_sql;
        EXECUTE conveyor_stmt;
        DEALLOCATE PREPARE conveyor_stmt;
        IF NOT @conveyor_kept THEN
            SET @conveyor_sql = CONCAT('ALTER TABLE conveyor_jobs EXCHANGE PARTITION ', day_name,
                                       ' WITH TABLE conveyor_jobs_dropped');
            PREPARE conveyor_stmt FROM @conveyor_sql;
            EXECUTE conveyor_stmt;
            DEALLOCATE PREPARE conveyor_stmt;
            CALL conveyor_jobs_forget_dropped();
            SET @conveyor_sql = CONCAT('ALTER TABLE conveyor_jobs DROP PARTITION ', day_name);
            PREPARE conveyor_stmt FROM @conveyor_sql;
            EXECUTE conveyor_stmt;
            DEALLOCATE PREPARE conveyor_stmt;
            SET pos = pos - 1;
        END IF;
    END LOOP dropping;
END;

CALL conveyor_jobs_add_days(2);
