-- Schema v20: the parameters a task type declares sensitive (@app.task(sensitive=)),
-- one row per name, recorded by every app that registers the task when it opens
-- the database. Every view hides their values, in every process, a server
-- started without the app too; searching the arguments skips them. ``position``:
-- the parameter's place among the positional ones (NULL: keyword-only).
-- Not in conveyor_task_settings: those are an operator's settings, which a
-- DELETE forgets; a declaration of the code's must not go with them.
CREATE TABLE conveyor_task_sensitive (
    task     text    NOT NULL,
    name     text    NOT NULL,
    position integer,
    PRIMARY KEY (task, name)
);
