-- Schema v22: MySQL/MariaDB partitions its job table as PostgreSQL did at v17.
-- Nothing changes in this dialect; the version is kept so every backend's
-- schema numbers line up.
SELECT 1;
