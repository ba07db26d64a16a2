-- Schema v16: a batch's progress from a rollup, as the queue counts are (v11):
-- statement-level triggers of their own append each statement's net change per
-- (batch, state) to conveyor_batch_count_deltas (nothing for jobs outside a batch),
-- and the leader's fold moves them into conveyor_batch_counts. batch.progress(), a
-- page of batches on the dashboard or `conveyor batches list`, and a batch's live
-- events no longer count the batch's jobs (a GROUP BY over its index entries: 23 ms
-- per 100,000 jobs, each time).
-- The table is locked against writers (readers go on) while the counts are taken
-- and the triggers created, so no change is counted twice or missed.
LOCK TABLE conveyor_jobs IN SHARE MODE;
CREATE TABLE conveyor_batch_counts (
    batch_id bigint NOT NULL,
    state    text   NOT NULL,
    n        bigint NOT NULL,
    PRIMARY KEY (batch_id, state)
);
CREATE TABLE conveyor_batch_count_deltas (
    batch_id bigint NOT NULL,
    state    text   NOT NULL,
    n        bigint NOT NULL
);
INSERT INTO conveyor_batch_counts (batch_id, state, n)
SELECT batch_id, state, count(*) FROM conveyor_jobs WHERE batch_id IS NOT NULL
GROUP BY batch_id, state;

CREATE FUNCTION conveyor_batch_count_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO conveyor_batch_count_deltas (batch_id, state, n)
        SELECT batch_id, state, count(*) FROM new_rows WHERE batch_id IS NOT NULL
        GROUP BY batch_id, state;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO conveyor_batch_count_deltas (batch_id, state, n)
        SELECT batch_id, state, -count(*) FROM old_rows WHERE batch_id IS NOT NULL
        GROUP BY batch_id, state;
    ELSE
        INSERT INTO conveyor_batch_count_deltas (batch_id, state, n)
        SELECT batch_id, state, sum(n) FROM (
            SELECT batch_id, state, -1 AS n FROM old_rows WHERE batch_id IS NOT NULL
            UNION ALL
            SELECT batch_id, state, 1 FROM new_rows WHERE batch_id IS NOT NULL
        ) moved
        GROUP BY batch_id, state
        HAVING sum(n) <> 0;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER conveyor_batch_count_insert AFTER INSERT ON conveyor_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_batch_count_rows();
CREATE TRIGGER conveyor_batch_count_update AFTER UPDATE ON conveyor_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_batch_count_rows();
CREATE TRIGGER conveyor_batch_count_delete AFTER DELETE ON conveyor_jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_batch_count_rows();
