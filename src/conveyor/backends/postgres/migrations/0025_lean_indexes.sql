-- Schema v25: MariaDB writes fewer index entries per claim (see its migration).
-- Nothing changes in this dialect; the version is kept so every backend's schema
-- numbers line up.
SELECT 1;
