-- Schema v11: job counts that cost nothing to read. Every statement that inserts,
-- deletes, or changes the state of jobs appends its net change per (queue, task,
-- state) to conveyor_count_deltas, from a statement-level trigger (one insert per
-- statement, whatever its number of rows: a batch of 100 outcomes is one row or
-- two); the leader folds the deltas into conveyor_counts every second. A reader
-- sums both: exact, and no scan of the jobs table, however big it grows.
-- (A trigger and not a CTE in every statement: it also counts what an operator
-- does by hand in SQL.)
CREATE TABLE conveyor_counts (
    queue text   NOT NULL,
    task  text   NOT NULL,
    state text   NOT NULL,
    n     bigint NOT NULL,
    PRIMARY KEY (queue, task, state)
);
CREATE TABLE conveyor_count_deltas (
    queue text   NOT NULL,
    task  text   NOT NULL,
    state text   NOT NULL,
    n     bigint NOT NULL
);
INSERT INTO conveyor_counts (queue, task, state, n)
SELECT queue, task, state, count(*) FROM conveyor_jobs GROUP BY queue, task, state;

CREATE FUNCTION conveyor_count_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO conveyor_count_deltas (queue, task, state, n)
        SELECT queue, task, state, count(*) FROM new_rows GROUP BY queue, task, state;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO conveyor_count_deltas (queue, task, state, n)
        SELECT queue, task, state, -count(*) FROM old_rows GROUP BY queue, task, state;
    ELSE
        INSERT INTO conveyor_count_deltas (queue, task, state, n)
        SELECT queue, task, state, sum(n) FROM (
            SELECT queue, task, state, -1 AS n FROM old_rows
            UNION ALL
            SELECT queue, task, state, 1 FROM new_rows
        ) moved
        GROUP BY queue, task, state
        HAVING sum(n) <> 0;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER conveyor_count_insert AFTER INSERT ON conveyor_jobs
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION conveyor_count_rows();
CREATE TRIGGER conveyor_count_update AFTER UPDATE ON conveyor_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_count_rows();
CREATE TRIGGER conveyor_count_delete AFTER DELETE ON conveyor_jobs
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION conveyor_count_rows();

-- The oldest job waiting in each queue (a metric, the dashboard) without a scan:
-- one index descent per queue.
CREATE INDEX conveyor_jobs_waiting_idx ON conveyor_jobs (queue, scheduled_at, id)
    WHERE state = 'available';
-- Scheduled jobs by due time: promotion reads the due ones in order, and the
-- oldest-waiting probe finds a queue's due-but-not-yet-promoted ones. Partial on
-- one state each, so neither can stand in for the fetch index in a claim (whose
-- WHERE spans both states: a planner that took the waiting index there sorted
-- every waiting job per claim).
CREATE INDEX conveyor_jobs_due_idx ON conveyor_jobs (scheduled_at)
    WHERE state = 'scheduled';
