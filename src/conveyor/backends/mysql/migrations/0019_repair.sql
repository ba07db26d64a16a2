-- Schema v19: repair databases created by an earlier text of 0001_init.
--
-- 0001 was edited in place after its release (9751346, 3edb14c, 10d644b), so a
-- database created by an earlier text recorded version 1 without what the later
-- texts added, and the code that expects it failed every claim (Unknown column
-- 'fetch_queue'). This brings each earlier text to the schema 0001 now creates:
--   8fda283  no conveyor_change_tx; change stamps were microseconds since the epoch
--   9751346  no fetch_queue, neg_priority; the fetch index on (queue, state, priority DESC, ...)
--   3edb14c  no chain_due_state; the chain index on (chain_next, state, id)
-- Each step looks at the schema first, so on a database that already has the
-- real one (the normal case) nothing changes. MySQL has no IF NOT EXISTS for
-- columns (MariaDB has), hence statements built from information_schema.

CREATE TABLE IF NOT EXISTS conveyor_change_tx (
    id bigint NOT NULL AUTO_INCREMENT PRIMARY KEY
) ENGINE=InnoDB;

-- Change numbers continue above the stamps already written (8fda283's were
-- microseconds since the epoch): otherwise every new change would sort before
-- the old ones, and a reader past an old stamp would never see a new change.
INSERT INTO conveyor_change_tx (id)
SELECT s.m + 1 FROM (
    SELECT GREATEST(
        COALESCE((SELECT MAX(changed) FROM conveyor_jobs), 0),
        COALESCE((SELECT MAX(changed) FROM conveyor_batches), 0)) AS m
) s
WHERE s.m > COALESCE((SELECT MAX(id) FROM conveyor_change_tx), 0);

-- One ALTER (one copy of the table) with whatever is missing or different:
-- the generated columns where 0001 now declares them, then the two indexes.
SET @conveyor_repair = (
    SELECT CONCAT_WS(', ',
        IF(SUM(c.COLUMN_NAME = 'fetch_queue') = 0,
           'ADD COLUMN fetch_queue varchar(255) AS (CASE WHEN state IN (''available'', ''scheduled'') THEN queue END) STORED AFTER unique_key_active, ADD COLUMN neg_priority integer AS (-priority) STORED AFTER fetch_queue',
           NULL),
        IF(SUM(c.COLUMN_NAME = 'chain_due_state') = 0,
           'ADD COLUMN chain_due_state varchar(16) AS (CASE WHEN chain IS NOT NULL AND chain_next IS NULL THEN state END) STORED AFTER neg_priority',
           NULL))
    FROM information_schema.COLUMNS c
    WHERE c.TABLE_SCHEMA = DATABASE() AND c.TABLE_NAME = 'conveyor_jobs'
);
SET @conveyor_repair = CONCAT_WS(', ', NULLIF(@conveyor_repair, ''), (
    SELECT CASE
        WHEN GROUP_CONCAT(s.COLUMN_NAME ORDER BY s.SEQ_IN_INDEX) = 'fetch_queue,neg_priority,scheduled_at,id' THEN NULL
        WHEN COUNT(*) = 0 THEN 'ADD KEY conveyor_jobs_fetch_idx (fetch_queue, neg_priority, scheduled_at, id)'
        ELSE 'DROP KEY conveyor_jobs_fetch_idx, ADD KEY conveyor_jobs_fetch_idx (fetch_queue, neg_priority, scheduled_at, id)'
    END
    FROM information_schema.STATISTICS s
    WHERE s.TABLE_SCHEMA = DATABASE() AND s.TABLE_NAME = 'conveyor_jobs'
      AND s.INDEX_NAME = 'conveyor_jobs_fetch_idx'
), (
    SELECT CASE
        WHEN GROUP_CONCAT(s.COLUMN_NAME ORDER BY s.SEQ_IN_INDEX) = 'chain_due_state,id' THEN NULL
        WHEN COUNT(*) = 0 THEN 'ADD KEY conveyor_jobs_chain_due_idx (chain_due_state, id)'
        ELSE 'DROP KEY conveyor_jobs_chain_due_idx, ADD KEY conveyor_jobs_chain_due_idx (chain_due_state, id)'
    END
    FROM information_schema.STATISTICS s
    WHERE s.TABLE_SCHEMA = DATABASE() AND s.TABLE_NAME = 'conveyor_jobs'
      AND s.INDEX_NAME = 'conveyor_jobs_chain_due_idx'
));
SET @conveyor_repair = IF(@conveyor_repair = '', 'DO 0',
                          CONCAT('ALTER TABLE conveyor_jobs ', @conveyor_repair));
PREPARE conveyor_repair FROM @conveyor_repair;
EXECUTE conveyor_repair;
DEALLOCATE PREPARE conveyor_repair;
SET @conveyor_repair = NULL;
