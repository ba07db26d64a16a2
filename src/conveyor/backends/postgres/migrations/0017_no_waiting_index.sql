-- Schema v17: the waiting index goes. It served one reader, the oldest-waiting
-- probe (a metric, the dashboard), and cost every enqueue an index entry: without
-- it a bulk enqueue measured 48,600 vs 44,500 jobs/s (`conveyor bench --phases
-- enqueue`, medians of five alternating runs of v16 and v17 code). That probe now
-- reads the fetch index, which holds every waiting job already (see
-- queue_oldest_waiting).
DROP INDEX IF EXISTS conveyor_jobs_waiting_idx;
