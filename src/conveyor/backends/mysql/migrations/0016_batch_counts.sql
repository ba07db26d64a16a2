-- Schema v16 (see the PostgreSQL migration): a batch's progress from a rollup. As
-- for the queue counts, row triggers append one delta row per change of a batch's
-- job and the leader folds them (counts_fold in mysql/backend.py). DDL commits
-- implicitly in MySQL, so workers may change jobs between the statements: the
-- triggers come first, and the rollup starts at the jobs' counts minus the deltas
-- already appended (read in one statement), so a change seen by the count is not
-- counted again by its delta, and one the count missed is counted by its delta.
CREATE TABLE conveyor_batch_counts (
    batch_id bigint      NOT NULL,
    state    varchar(16) NOT NULL,
    n        bigint      NOT NULL,
    PRIMARY KEY (batch_id, state)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE conveyor_batch_count_deltas (
    id       bigint      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    batch_id bigint      NOT NULL,
    state    varchar(16) NOT NULL,
    n        bigint      NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TRIGGER conveyor_batch_count_insert AFTER INSERT ON conveyor_jobs FOR EACH ROW
BEGIN
    IF NEW.batch_id IS NOT NULL THEN
        INSERT INTO conveyor_batch_count_deltas (batch_id, state, n)
        VALUES (NEW.batch_id, NEW.state, 1);
    END IF;
END;
CREATE TRIGGER conveyor_batch_count_update AFTER UPDATE ON conveyor_jobs FOR EACH ROW
BEGIN
    IF NOT (OLD.state <=> NEW.state AND OLD.batch_id <=> NEW.batch_id) THEN
        IF OLD.batch_id IS NOT NULL THEN
            INSERT INTO conveyor_batch_count_deltas (batch_id, state, n)
            VALUES (OLD.batch_id, OLD.state, -1);
        END IF;
        IF NEW.batch_id IS NOT NULL THEN
            INSERT INTO conveyor_batch_count_deltas (batch_id, state, n)
            VALUES (NEW.batch_id, NEW.state, 1);
        END IF;
    END IF;
END;
CREATE TRIGGER conveyor_batch_count_delete AFTER DELETE ON conveyor_jobs FOR EACH ROW
BEGIN
    IF OLD.batch_id IS NOT NULL THEN
        INSERT INTO conveyor_batch_count_deltas (batch_id, state, n)
        VALUES (OLD.batch_id, OLD.state, -1);
    END IF;
END;
INSERT INTO conveyor_batch_counts (batch_id, state, n)
SELECT batch_id, state, sum(n) FROM (
    SELECT batch_id, state, count(*) AS n FROM conveyor_jobs WHERE batch_id IS NOT NULL
    GROUP BY batch_id, state
    UNION ALL
    SELECT batch_id, state, -sum(n) FROM conveyor_batch_count_deltas GROUP BY batch_id, state
) c
GROUP BY batch_id, state;
