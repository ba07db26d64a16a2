-- Schema v18: PostgreSQL's bulk enqueue by COPY leaves the times and change stamp
-- of jobs that start now to column defaults. Nothing changes in this dialect; the
-- version is kept so every backend's schema numbers line up.
SELECT 1;
