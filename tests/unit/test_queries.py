"""The dialects expose the same named queries, except where a dialect needs a
different shape; every difference is listed here with its reason."""

from conveyor.backends.postgres import backend as pg
from conveyor.backends.sqlite import backend as lite

# PostgreSQL does a whole batch (or a whole operation) in one statement with
# CTEs; SQLite runs one statement per row, or several, under BEGIN IMMEDIATE.
PG_ONLY = {
    "job_finalize_many",
    "job_release_many",
    "job_rescue_expired",
    "migration_lock",
    "batch_cancel",
    "batch_retry_failed",
    "job_chain_append",  # jsonb ||; SQLite appends in Python under the write lock
    "job_prune",  # one DELETE with CTEs; SQLite: ids, then two deletes
    "limits_lock",  # advisory lock; SQLite claims serialise under BEGIN IMMEDIATE
}
SQLITE_ONLY = {
    "job_finalize_one",
    "attempt_insert",
    "job_release_one",
    "job_expired_leases",
    "job_rescue_one",
    "data_version",
    "job_peek_available",
    "batch_mark_cancelled",
    "batch_cancel_jobs",
    "batch_reopen",
    "batch_retry_jobs",
    "job_chain_get",
    "job_chain_set",
    "job_prune_ids",
    "job_delete_ids",
    "attempt_delete_ids",
}


def test_query_names_match_across_dialects():
    assert set(pg.Q) - PG_ONLY == set(lite.Q) - SQLITE_ONLY
    assert set(pg.Q) >= PG_ONLY and set(lite.Q) >= SQLITE_ONLY


def test_migrations_line_up():
    assert [m.version for m in pg.MIGRATIONS] == [m.version for m in lite.MIGRATIONS]
    assert [m.name for m in pg.MIGRATIONS] == [m.name for m in lite.MIGRATIONS]
