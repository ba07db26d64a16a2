-- Schema v11 (see the PostgreSQL migration): job counts kept by triggers. SQLite has
-- one writer, so row triggers update the counts directly, in the writing
-- transaction; conveyor_count_deltas stays empty (the shared reader sums both).
CREATE TABLE conveyor_counts (
    queue TEXT    NOT NULL,
    task  TEXT    NOT NULL,
    state TEXT    NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (queue, task, state)
);
CREATE TABLE conveyor_count_deltas (
    queue TEXT    NOT NULL,
    task  TEXT    NOT NULL,
    state TEXT    NOT NULL,
    n     INTEGER NOT NULL
);
INSERT INTO conveyor_counts (queue, task, state, n)
SELECT queue, task, state, count(*) FROM conveyor_jobs GROUP BY queue, task, state;
CREATE TRIGGER conveyor_count_insert AFTER INSERT ON conveyor_jobs
BEGIN
    INSERT INTO conveyor_counts (queue, task, state, n) VALUES (NEW.queue, NEW.task, NEW.state, 1)
    ON CONFLICT (queue, task, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER conveyor_count_update AFTER UPDATE OF state, queue, task ON conveyor_jobs
WHEN OLD.state <> NEW.state OR OLD.queue <> NEW.queue OR OLD.task <> NEW.task
BEGIN
    UPDATE conveyor_counts SET n = n - 1
    WHERE queue = OLD.queue AND task = OLD.task AND state = OLD.state;
    INSERT INTO conveyor_counts (queue, task, state, n) VALUES (NEW.queue, NEW.task, NEW.state, 1)
    ON CONFLICT (queue, task, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER conveyor_count_delete AFTER DELETE ON conveyor_jobs
BEGIN
    UPDATE conveyor_counts SET n = n - 1
    WHERE queue = OLD.queue AND task = OLD.task AND state = OLD.state;
END;
CREATE INDEX conveyor_jobs_waiting_idx ON conveyor_jobs (queue, scheduled_at)
    WHERE state = 'available';
-- Scheduled jobs by due time: promotion reads the due ones in order, and the
-- oldest-waiting probe finds a queue's due-but-not-yet-promoted ones. Partial on
-- one state each, so neither can stand in for the fetch index in a claim (whose
-- WHERE spans both states: a planner that took the waiting index there sorted
-- every waiting job per claim).
CREATE INDEX conveyor_jobs_due_idx ON conveyor_jobs (scheduled_at)
    WHERE state = 'scheduled';
