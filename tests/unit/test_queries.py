"""The dialects expose the same named queries, except where a dialect needs a
different shape; every difference is listed here with its reason."""

from conveyor.backends.postgres import backend as pg
from conveyor.backends.sqlite import backend as lite

# PostgreSQL does the whole batch in one statement; SQLite runs one per row.
PG_ONLY = {
    "job_finalize_many",
    "job_release_many",
    "job_rescue_expired",
    "migration_lock",
}
SQLITE_ONLY = {
    "job_finalize_one",
    "attempt_insert",
    "job_release_one",
    "job_expired_leases",
    "job_rescue_one",
    "data_version",
    "job_peek_available",
}


def test_query_names_match_across_dialects():
    assert set(pg.Q) - PG_ONLY == set(lite.Q) - SQLITE_ONLY
    assert set(pg.Q) >= PG_ONLY and set(lite.Q) >= SQLITE_ONLY


def test_migrations_line_up():
    assert [m.version for m in pg.MIGRATIONS] == [m.version for m in lite.MIGRATIONS]
    assert [m.name for m in pg.MIGRATIONS] == [m.name for m in lite.MIGRATIONS]
