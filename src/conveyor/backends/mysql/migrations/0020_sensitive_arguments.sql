-- Schema v20 (see the PostgreSQL migration): the parameters a task type declares
-- sensitive, one row per name.
CREATE TABLE conveyor_task_sensitive (
    task     varchar(255) NOT NULL,
    name     varchar(255) NOT NULL,
    position integer,
    PRIMARY KEY (task, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
