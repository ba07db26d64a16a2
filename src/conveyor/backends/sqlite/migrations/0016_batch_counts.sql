-- Schema v16 (see the PostgreSQL migration): a batch's progress from a rollup kept
-- by row triggers, in the writing transaction (one writer at a time, as for the
-- queue counts of v11); conveyor_batch_count_deltas stays empty (the shared
-- reader sums both). Only jobs of a batch fire them.
CREATE TABLE conveyor_batch_counts (
    batch_id INTEGER NOT NULL,
    state    TEXT    NOT NULL,
    n        INTEGER NOT NULL,
    PRIMARY KEY (batch_id, state)
);
CREATE TABLE conveyor_batch_count_deltas (
    batch_id INTEGER NOT NULL,
    state    TEXT    NOT NULL,
    n        INTEGER NOT NULL
);
INSERT INTO conveyor_batch_counts (batch_id, state, n)
SELECT batch_id, state, count(*) FROM conveyor_jobs WHERE batch_id IS NOT NULL
GROUP BY batch_id, state;
CREATE TRIGGER conveyor_batch_count_insert AFTER INSERT ON conveyor_jobs
WHEN NEW.batch_id IS NOT NULL
BEGIN
    INSERT INTO conveyor_batch_counts (batch_id, state, n) VALUES (NEW.batch_id, NEW.state, 1)
    ON CONFLICT (batch_id, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER conveyor_batch_count_update AFTER UPDATE OF state, batch_id ON conveyor_jobs
WHEN (OLD.batch_id IS NOT NULL OR NEW.batch_id IS NOT NULL)
 AND (OLD.state <> NEW.state OR OLD.batch_id IS NOT NEW.batch_id)
BEGIN
    UPDATE conveyor_batch_counts SET n = n - 1
    WHERE batch_id = OLD.batch_id AND state = OLD.state;
    INSERT INTO conveyor_batch_counts (batch_id, state, n)
    SELECT NEW.batch_id, NEW.state, 1 WHERE NEW.batch_id IS NOT NULL
    ON CONFLICT (batch_id, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER conveyor_batch_count_delete AFTER DELETE ON conveyor_jobs
WHEN OLD.batch_id IS NOT NULL
BEGIN
    UPDATE conveyor_batch_counts SET n = n - 1
    WHERE batch_id = OLD.batch_id AND state = OLD.state;
END;
