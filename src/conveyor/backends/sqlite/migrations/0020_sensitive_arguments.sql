-- Schema v20 (see the PostgreSQL migration): the parameters a task type declares
-- sensitive, one row per name.
CREATE TABLE conveyor_task_sensitive (
    task     TEXT    NOT NULL,
    name     TEXT    NOT NULL,
    position INTEGER,
    PRIMARY KEY (task, name)
);
