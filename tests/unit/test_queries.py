"""The SQL files: the shared queries, and every place a dialect writes its own,
with its reason; the macro and parameter-style conversion they rely on."""

import re
from importlib import resources

import pytest

from conveyor.backends.mysql import backend as my
from conveyor.backends.postgres import backend as pg
from conveyor.backends.sql import loader
from conveyor.backends.sql.loader import Dialect, shared_query_names, to_pyformat
from conveyor.backends.sqlite import backend as lite

# The hot paths, where strategy truly differs: PostgreSQL does a whole batch in
# one statement with arrays, CTEs and NOTIFY; SQLite runs a statement per row (or
# several) under BEGIN IMMEDIATE.
PG_ONLY = {
    "job_insert_one",  # a plain send: scalars, where job_insert_many sends arrays
    "job_copy_begin",  # job_insert_stream by COPY; the others take the whole list
    "job_copy",
    "job_copy_span",  # how many, from which id to which: one row, not one per job
    "job_copy_ids",
    "job_copy_now",  # the same, its times and change stamp left to defaults (v18)
    "job_copy_delays",
    "job_finalize_many",
    "job_release_many",
    "job_rescue",
    "worker_heartbeat",
    "migration_lock",  # advisory lock; SQLite migrators serialise on the write lock
    "job_add_days",  # the partitions of finished jobs (schema v17)
    "job_drop_days",
    "job_drop_taken_keys",  # idempotency keys across those partitions
    "limits_lock",  # an advisory lock (the queue's); SQLite serialises its claims
    # under BEGIN IMMEDIATE
    "job_claim_candidates",  # a limited claim's window and its keys' stripe locks
    "queue_running",  # the room left under a queue limit, counted under its lock
    "job_claim_keyed",  # job_claim_limited where keys alone limit: arrays, one ranking
    "job_claim_limited_function",  # those statements, run by the server in one call
    "job_claim_limited_call",
    "queue_room_function",  # the room under a queue limit alone, job_claim sized by it
    "notify",
    "notify_events",
    "tables_to_tidy",  # VACUUM, ANALYZE: SQLite reuses freed pages, InnoDB purges
    "table_planned_empty",
    "change_stamp",  # the newest change stamps, polled behind a transaction pooler
    "replica_lag",  # how far a streaming replica trails (read_url)
}
SQLITE_ONLY = {
    "job_finalize_one",
    "job_succeed_many",  # plain successes of a batch in one UPDATE ... FROM json_each
    "job_release_one",
    "job_expired_leases",
    "job_rescue_one",
    "worker_upsert",
    "data_version",  # its "LISTEN": the file's change counter
    "job_peek_available",  # a read-only look before taking the write lock
    "job_max_id",  # job_insert_many by executemany, then the ids it made
    "job_ids_after",
}
# Written by each dialect in its own way, for the reason given.
EACH_OWN = {
    "job_insert_many": "PostgreSQL: arrays + unnest; SQLite: positional, executemany or by row",
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
    "filter_search": "jsonb_each vs json_each vs JSON_TABLE: sensitive arguments skipped",
}


# MySQL / MariaDB: no UPDATE ... RETURNING, so its hot paths lock (SKIP LOCKED),
# update by primary key and read back, statement by statement; the ranking of a
# limited claim is done in Python; change numbers are rows of a table of their own.
MYSQL_ONLY = {
    "job_insert_head",  # INSERT IGNORE ... VALUES; rows appended per chunk
    "job_insert_row",
    "job_claim_pick",  # SELECT ... FOR UPDATE SKIP LOCKED
    "job_claim_update",  # then UPDATE by primary key
    "job_get_many",  # then read back
    "job_get_claimed",  # (a claim's, from the live partition: schema v22)
    "job_claim_candidates",  # a limited claim's window, ranked by the backend
    "limits_busy",
    "limits_tokens",
    "limits_lock",  # a row lock on the queue's row (no transaction advisory locks)
    "limits_lock_keys",  # named locks (GET_LOCK), one per key: a session's, not
    "limits_unlock_keys",  # a transaction's, so released after the COMMIT
    "queue_running",
    "job_finalize_pick",
    "job_succeed_many",  # plain successes of a batch in one UPDATE
    "job_finalize_one",
    "job_finalized",
    "job_release_pick",
    "job_release_one",
    "worker_upsert",  # ON DUPLICATE KEY UPDATE
    "worker_get",
    "job_expired_leases",  # SKIP LOCKED
    "job_rescue_one",
    "job_rescued",
    "job_schedule_pick",
    "job_schedule_ids",
    "job_age_pick",
    "job_age_one",
    "counts_fold_high",  # deltas locked up to an id, summed and deleted in the database
    "counts_fold_lock",
    "counts_fold_add",
    "counts_fold_delete",
    "batch_counts_fold_high",  # the same for the batches' rollup
    "batch_counts_fold_lock",
    "batch_counts_fold_add",
    "batch_counts_fold_delete",
    "change_take",  # change numbers (no transaction id in MySQL)
    "change_numbers",
    "change_numbers_committed",
    "change_prune",
    "max_change",  # the notifier's poll (no LISTEN)
    "migration_lock",  # GET_LOCK: a session lock (DDL commits implicitly)
    "migration_unlock",
    "migration_progress_table",  # a migration resumed where a cut left it
    "migration_progress",
    "migration_progress_set",
    "migration_progress_clear",
    "job_add_days",  # the partitions of finished jobs (schema v22): procedures
    "job_drop_days",
    "job_days_result",  # their results, left in session variables
    "upkeep_wait",  # their ALTERs wait for the table this long, then give up
    "upkeep_wait_default",
}
# Shared queries MySQL writes its own way, each for the reason given.
MYSQL_OVERRIDES = {
    "batch_insert": "INSERT IGNORE, the id from lastrowid (no ON CONFLICT, no RETURNING)",
    "leader_attempt_elect": "ON DUPLICATE KEY UPDATE with IF() in assignment order",
    "periodic_register": "INSERT IGNORE",
    "queue_set_paused": "ON DUPLICATE KEY UPDATE",
    "queue_set_limit": "ON DUPLICATE KEY UPDATE",
    "queue_set_rate": "ON DUPLICATE KEY UPDATE",
    "task_settings_upsert": "ON DUPLICATE KEY UPDATE",
    "task_sensitive_upsert": "ON DUPLICATE KEY UPDATE",
    "queue_oldest_waiting": "a derived table cannot see the outer query in MySQL",
    "job_find_by_keys": "a locking read: the latest rows, even in a REPEATABLE READ snapshot",
    "job_chain_due": "by a generated column and its index (no partial index)",
    "workflow_insert": "INSERT IGNORE, the id from lastrowid (as batch_insert)",
    "step_insert": "INSERT IGNORE",
    "event_insert": "INSERT IGNORE",
    "event_prune": "DELETE ... LIMIT (no LIMIT in an IN subquery)",
    "job_prune_count": "by the time index (schema v25), in the state's partitions",
    "batch_ready": "the batch index has no state (v25): the live partition",
    "batch_first_finished": "the batch index has no state (v25): the finished partitions",
    "batch_cancel_jobs": "the batch index has no state (v25): the live partition",
}
# EACH_OWN queries MySQL does not need: its backend does them with the above.
MYSQL_NOT_NEEDED = {
    "job_insert_many",
    "job_claim",
    "job_claim_limited",
    "job_schedule_due",
    "job_age_priorities",
    "counts_fold",
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


def test_mysql_writes_only_what_differs():
    mine = own("conveyor.backends.mysql")
    assert mine & shared_query_names() == set(MYSQL_OVERRIDES)
    assert mine - shared_query_names() == MYSQL_ONLY | (set(EACH_OWN) - MYSQL_NOT_NEEDED)
    assert set(my.Q) >= shared_query_names() | MYSQL_ONLY


def test_migrations_line_up():
    assert [m.version for m in pg.MIGRATIONS] == [m.version for m in lite.MIGRATIONS]
    assert [m.name for m in pg.MIGRATIONS] == [m.name for m in lite.MIGRATIONS]
    # MySQL: the whole schema in 0001, the same numbers and names after it
    assert [(m.version, m.name) for m in my.MIGRATIONS] == [
        (m.version, m.name) for m in pg.MIGRATIONS
    ]


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


def test_sqlite_insert_binds_every_field_to_its_own_column():
    """SQLite's job_insert_many is positional (?N is the N-th JobInsert field): a
    field moved in JobInsert must not land in another column unnoticed."""
    from conveyor.records import JobInsert

    sql = lite.Q["job_insert_many"]
    columns = re.search(r"INSERT INTO conveyor_jobs \((.*?)\)", sql, re.S)[1].split(",")
    values, depth, part = [], 0, ""
    for ch in re.search(r"VALUES \((.*)\)\s*ON CONFLICT", sql, re.S)[1]:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            values.append(part.strip())
            part = ""
        else:
            part += ch
    values.append(part.strip())
    bound = dict(zip((c.strip() for c in columns), values, strict=True))
    fields = JobInsert._fields
    for column, value in bound.items():
        if re.fullmatch(r"\?\d+", value) and value != f"?{len(fields) + 1}":
            assert fields[int(value[1:]) - 1].removesuffix("_json") == column
    assert bound["created_at"] == f"?{len(fields) + 1}"  # the time
    assert bound["scheduled_at"] == f"?{len(fields) + 1} + ?{fields.index('delay_s') + 1}"
    plain = {v for v in bound.values() if re.fullmatch(r"\?\d+", v)}
    assert len(plain) == len(fields)  # every field but delay_s, and the time


def test_the_limited_claims_function_is_made_of_the_named_statements() -> None:
    """pg.plpgsql: each {{name}} slot becomes that statement, its parameters the
    function's p_<name> or what the slot gives; nothing psycopg would have
    converted is left, since the function is sent without parameters."""
    queries = {"one": "SELECT %(a)s, %(b)s::int[] -- ends in a comment", "two": "SELECT %(c)b"}
    made = pg.plpgsql("BEGIN {{one b=v_b}}; RETURN QUERY {{two}}; END", queries)
    assert made == (
        "BEGIN \nSELECT p_a, v_b::int[] -- ends in a comment\n; RETURN QUERY \nSELECT p_c\n; END"
    )
    with pytest.raises(ValueError):
        pg.plpgsql("{{one}} WHERE x LIKE '%%'", queries)
    fn = pg.CLAIM_LIMITED_FUNCTION
    assert "{{" not in fn and "%" not in fn
    for name in ("limits_lock", "queue_running", "job_claim_candidates"):  # as they are
        assert pg.plpgsql(f"{{{{{name}}}}}", pg.Q).strip() in fn


def test_a_fragment_is_written_once_and_placed_where_queries_name_it() -> None:
    """``-- fragment:``: text two queries share, as if written in each (its comment
    lines gone with theirs), and no query itself; a name without a fragment fails."""
    text = (
        "-- name: one\nWITH picked AS (SELECT 1)\n{FRAGMENT(tail)}\n"
        "-- fragment: tail\n-- why\n  SELECT id  -- kept\n  FROM picked;\n"
        "-- name: two\nSELECT 2 AS id\n{FRAGMENT(tail)}\n"
    )
    queries = loader._split(text, "test.sql")
    assert queries == {
        "one": "WITH picked AS (SELECT 1)\nSELECT id  -- kept\nFROM picked",
        "two": "SELECT 2 AS id\nSELECT id  -- kept\nFROM picked",
    }
    with pytest.raises(ValueError, match="no fragment 'tale'"):
        loader._split("-- name: one\n{FRAGMENT(tale)}\n", "test.sql")
    with pytest.raises(ValueError, match="fragment 'tail' defined twice"):
        loader._split("-- fragment: tail\nA\n-- fragment: tail\nB\n", "test.sql")
    # The PostgreSQL claims end alike (the fragment job_claimed), written once.
    tail = pg.Q["job_claim_limited"][pg.Q["job_claim_limited"].index("UPDATE conveyor_jobs j") :]
    assert pg.Q["job_claim"].endswith(tail) and len(tail.splitlines()) == 18
