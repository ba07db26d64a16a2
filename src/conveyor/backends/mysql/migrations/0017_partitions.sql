-- Schema v17: PostgreSQL partitions its job table (finished jobs leave the hot
-- table, retention drops whole days). Nothing changes in this dialect; the
-- version is kept so every backend's schema numbers line up.
SELECT 1;
