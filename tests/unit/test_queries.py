"""The SQL files: the shared queries, and every place a dialect writes its own,
with its reason; the macro and parameter-style conversion they rely on."""

import re
from importlib import resources

import pytest

from conveyor.backends.postgres import backend as pg
from conveyor.backends.sql.loader import Dialect, shared_query_names, to_pyformat
from conveyor.backends.sqlite import backend as lite

# The hot paths, where strategy truly differs: PostgreSQL does a whole batch in
# one statement with arrays, CTEs and NOTIFY; SQLite runs a statement per row (or
# several) under BEGIN IMMEDIATE.
PG_ONLY = {
    "job_finalize_many",
    "job_release_many",
    "job_rescue",
    "worker_heartbeat",
    "migration_lock",  # advisory lock; SQLite migrators serialise on the write lock
    "limits_lock",  # advisory lock; SQLite claims serialise under BEGIN IMMEDIATE
    "limits_lock_keys",  # the keyed claims' shared lock, after the queue's own
    "queue_running",  # the room left under a queue limit, counted under its lock
    "notify",
    "notify_events",
}
SQLITE_ONLY = {
    "job_finalize_one",
    "attempt_insert",
    "job_release_one",
    "job_expired_leases",
    "job_rescue_one",
    "worker_upsert",
    "job_held",
    "data_version",  # its "LISTEN": the file's change counter
    "job_peek_available",  # a read-only look before taking the write lock
}
# Written by each dialect in its own way, for the reason given.
EACH_OWN = {
    "job_insert_many": "PostgreSQL: arrays + unnest in one statement; SQLite: a row at a time",
    "job_claim": "SKIP LOCKED + LATERAL per queue vs one queue per statement",
    "job_claim_limited": "jsonb ?| vs json_each, MATERIALIZED CTEs",
    "job_schedule_due": "SKIP LOCKED",
    "job_age_priorities": "SKIP LOCKED and interval arithmetic",
    "job_prune_ids": "SKIP LOCKED",
    "queue_list": "jsonb_object_agg + FULL JOIN vs json_group_object + UNION",
    "queue_mark_keyed": "an array of queues vs one queue",
    "rate_spend": "interval arithmetic in the refill",
    "schema_version_exists": "to_regclass vs sqlite_master",
    "schema_version_table": "column types",
    "changes_head": "the oldest running transaction vs the largest stamp",
    "counts_fold": "deltas folded by the leader vs counts kept by row triggers",
}


def own(package: str) -> set[str]:
    text = resources.files(package).joinpath("queries.sql").read_text()
    return set(re.findall(r"^-- name: (\w+)", text, re.MULTILINE))


def test_every_dialect_has_every_query_but_the_listed_differences():
    assert set(pg.Q) - PG_ONLY == set(lite.Q) - SQLITE_ONLY
    assert set(pg.Q) >= PG_ONLY and set(lite.Q) >= SQLITE_ONLY


def test_dialects_write_only_what_differs():
    mine_pg, mine_lite = own("conveyor.backends.postgres"), own("conveyor.backends.sqlite")
    assert mine_pg - PG_ONLY == set(EACH_OWN)
    assert mine_lite - SQLITE_ONLY == set(EACH_OWN)
    # nothing shared is silently overridden
    assert not (mine_pg | mine_lite) & shared_query_names()
    assert len(shared_query_names()) > len(EACH_OWN) * 3


def test_migrations_line_up():
    assert [m.version for m in pg.MIGRATIONS] == [m.version for m in lite.MIGRATIONS]
    assert [m.name for m in pg.MIGRATIONS] == [m.name for m in lite.MIGRATIONS]


def test_pyformat_conversion_leaves_quotes_and_casts_alone():
    sql = "SELECT :a::text, 'x:y %', '' || :b_2 FROM t WHERE c LIKE '%' || :c"
    assert to_pyformat(sql) == (
        "SELECT %(a)s::text, 'x:y %%', '' || %(b_2)s FROM t WHERE c LIKE '%%' || %(c)s"
    )


def test_macros_expand_per_dialect_and_unknown_ones_fail():
    d = Dialect("t", "named", {"NOW": lambda a: ":now", "IN": lambda a: f"IN {a}"})
    assert d.expand("x < {NOW} AND y {IN(:p, bigint)} AND {FILTER}") == (
        "x < :now AND y IN [':p', 'bigint'] AND {FILTER}"
    )
    with pytest.raises(ValueError, match="unknown SQL macro"):
        d.expand("{NOPE}")
