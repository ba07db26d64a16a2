-- Schema v25: fewer index entries written by a claim (issue 41). A claim
-- (available -> running) rewrote the entry of every index that holds state: nine
-- of them. Four of those change so that a claim leaves them alone:
-- * conveyor_jobs_lease_idx (state, lease_expires_at) goes: the rescue reads the
--   running jobs (few: the workers' concurrency) of the live partition through
--   conveyor_jobs_problem_idx (state, id), in the id order it returns them.
-- * conveyor_jobs_due_idx (state, scheduled_at) and conveyor_jobs_finished_idx
--   (state, finished_at) become one index on a virtual column, due_or_finished_at:
--   the due time of a scheduled job, the finish time of a finished one, NULL
--   while a job waits or runs, so a claim keeps its NULL. Promotion reads the
--   live partition's range (NULLs are never in it); retention reads a state's
--   own partitions (its queries name their part range, see job_prune_ids).
-- * conveyor_jobs_batch_idx loses state: (batch_id) is (batch_id, id, part) in
--   InnoDB, and the partitions tell live jobs (part 0) from finished ones.
-- An outcome still moves its row to a day partition (every index entry is
-- deleted and inserted): two indexes fewer to write. VIRTUAL: adding the column
-- does not rebuild the table. No AND in the expression (see migration 22:
-- EXCHANGE PARTITION). conveyor_jobs_dropped changes the same way: EXCHANGE
-- PARTITION wants the same columns and keys.
ALTER TABLE conveyor_jobs
    ADD COLUMN due_or_finished_at datetime(6) AS (CASE WHEN state = 'scheduled' THEN scheduled_at
                                                       ELSE finished_at END) VIRTUAL,
    DROP KEY conveyor_jobs_lease_idx,
    DROP KEY conveyor_jobs_due_idx,
    DROP KEY conveyor_jobs_finished_idx,
    DROP KEY conveyor_jobs_batch_idx,
    ADD KEY conveyor_jobs_batch_idx (batch_id),
    ADD KEY conveyor_jobs_time_idx (due_or_finished_at);

ALTER TABLE conveyor_jobs_dropped
    ADD COLUMN due_or_finished_at datetime(6) AS (CASE WHEN state = 'scheduled' THEN scheduled_at
                                                       ELSE finished_at END) VIRTUAL,
    DROP KEY conveyor_jobs_lease_idx,
    DROP KEY conveyor_jobs_due_idx,
    DROP KEY conveyor_jobs_finished_idx,
    DROP KEY conveyor_jobs_batch_idx,
    ADD KEY conveyor_jobs_batch_idx (batch_id),
    ADD KEY conveyor_jobs_time_idx (due_or_finished_at);
