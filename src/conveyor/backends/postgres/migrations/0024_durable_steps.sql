-- Schema v24: durable steps inside one job, and the events they wait for.
--
-- conveyor_job_steps: what a handler's ctx.step / ctx.sleep / ctx.wait_for_event
-- stored, by (job, step name). A rerun of the handler (a retry, a wake-up) reads
-- a stored step back instead of running it again. Rows are written only by the
-- attempt that holds the job (fenced by its lease token, as outcomes are) and go
-- when their job goes (deletes, retention; maintenance sweeps the ones whose job
-- left by a dropped partition).
--   kind       'step': result is the step's value (JSON text)
--              'sleep': wake_at is when the sleep ends (stored once)
--              'wait': event_key is the key waited for, wake_at its deadline;
--                      done once the event's payload (result) was taken, or the
--                      deadline passed (timed_out)
-- conveyor_events: one row per key, the first payload emitted for it (later
-- emits for the key change nothing); kept for a while (maintenance prunes old
-- ones), so an event emitted before its waiter waits is not lost.
CREATE TABLE conveyor_job_steps (
    job_id     bigint      NOT NULL,
    name       text        NOT NULL,
    kind       text        NOT NULL,
    result     text,
    done       boolean     NOT NULL DEFAULT FALSE,
    timed_out  boolean     NOT NULL DEFAULT FALSE,
    wake_at    timestamptz,
    event_key  text,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);
-- the waits still open, by key: what an emit and the leader's pass look up
CREATE INDEX conveyor_job_steps_waiting_idx ON conveyor_job_steps (event_key)
    WHERE kind = 'wait' AND NOT done;

CREATE TABLE conveyor_events (
    event_key  text        NOT NULL PRIMARY KEY,
    payload    text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX conveyor_events_created_idx ON conveyor_events (created_at);
