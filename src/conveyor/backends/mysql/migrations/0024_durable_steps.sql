-- Schema v24 (see the PostgreSQL migration): durable steps inside one job, and
-- the events they wait for. No partial index: the open waits are found by key
-- among all of a key's waits (few). Step names are at most 200 characters and
-- event keys 512 (the primary keys' limits).
CREATE TABLE conveyor_job_steps (
    job_id     bigint       NOT NULL,
    name       varchar(200) NOT NULL,
    kind       varchar(8)   NOT NULL,
    result     mediumtext,
    done       boolean      NOT NULL DEFAULT FALSE,
    timed_out  boolean      NOT NULL DEFAULT FALSE,
    wake_at    datetime(6),
    event_key  varchar(512),
    created_at datetime(6)  NOT NULL,
    PRIMARY KEY (job_id, name),
    KEY conveyor_job_steps_waiting_idx (event_key, done)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE conveyor_events (
    event_key  varchar(512) NOT NULL PRIMARY KEY,
    payload    mediumtext,
    created_at datetime(6)  NOT NULL,
    KEY conveyor_events_created_idx (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
