"""Keyed claims lock their keys, not every key: a limited claim tries a lock on
each of its candidates' concurrency and rate keys (at most 128) and leaves out
the candidates of keys another claim holds, as SKIP LOCKED leaves rows out. So a
key shared by two queues is never counted by two claims at once (never
over-admitted), and claims never wait on each other's keys. (A claim in flight is
held open here, its transaction not committed, as a worker between its claim and
its COMMIT.)"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from conveyor import Conveyor
from conveyor.backends.postgres.backend import CLAIM_LIMITED_FUNCTION, QUEUE_LIMITED_CLAIM

from ..conftest import only_on, pg_schema_url
from .helpers import fetch, ins, keyed_claim_params


@pytest.fixture
def pg(backend):
    """The backend of a test of PostgreSQL's key locks (advisory locks)."""
    return backend


def _params(pg, queue: str, window: int = 10) -> dict[str, Any]:
    return pg._params(
        keyed_claim_params(pg, queue, limit=10, factor=1, worker="held", window=window)
    )


def _call(pg, queue: str, *, queue_lock: bool = False, **kw: Any) -> dict[str, Any]:
    """The parameters of the limited claim's one call (job_claim_limited_call)."""
    return {
        **_params(pg, queue),
        "queue_lock": queue_lock,
        "queue_only": False,
        "max_running": None,
        **kw,
    }


@contextmanager
def _claim_in_flight(pg, queue: str, **kw: Any) -> Iterator[list[Any]]:
    """A limited claim of ``queue`` as the backend makes it (its function, in one
    call), left uncommitted."""
    with pg.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
        cur.execute(CLAIM_LIMITED_FUNCTION)
        cur.execute(pg.Q["job_claim_limited_call"], _call(pg, queue, **kw))
        yield list(cur.fetchall())


def _claim_in_thread(pg, queue: str) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []
    thread = threading.Thread(
        target=lambda: got.append(fetch(pg, 10, queues=(queue,), worker="w2")), daemon=True
    )
    thread.start()
    return thread, got


@only_on("postgres")
def test_claims_whose_keys_do_not_meet_do_not_wait_on_each_other(pg):
    a, b = "a", "b"
    pg.job_insert_many(jobs=[ins(queue="qa", concurrency_key=a, concurrency_limit=1)])
    pg.job_insert_many(jobs=[ins(queue="qb", concurrency_key=b, concurrency_limit=1)])
    with _claim_in_flight(pg, "qa") as held:
        assert len(held) == 1
        thread, got = _claim_in_thread(pg, "qb")
        thread.join(30)
        # under one lock for every keyed claim, this claim waited for the other
        assert not thread.is_alive(), "a claim of another key waited on the claim in flight"
        assert [j.concurrency_key for j in got[0]] == [b]


@pytest.mark.parametrize("shared", ["concurrency", "rate"])
@only_on("postgres")
def test_a_key_held_by_a_claim_in_flight_is_skipped_then_counted(pg, shared):
    """Queues qa and qb share key k (2 slots, or 2 tokens). While the claim of qa
    that took one is in flight, a claim of qb leaves k out at once; after its
    COMMIT, a claim of qb counts what it took: one left, not two."""
    key = {"concurrency_key": "k", "concurrency_limit": 2}
    if shared == "rate":
        key = {"rate_key": "k", "rate_per_s": 0.01, "rate_burst": 2.0}
    pg.job_insert_many(jobs=[ins(queue="qa", **key)])
    pg.job_insert_many(jobs=[ins(queue="qb", **key) for _ in range(2)])
    with _claim_in_flight(pg, "qa") as held:
        assert len(held) == 1
        thread, got = _claim_in_thread(pg, "qb")
        thread.join(30)
        assert not thread.is_alive(), "a claim waited on a key held by another"
        assert got[0] == []
    assert len(fetch(pg, 10, queues=("qb",), worker="w3")) == 1


@only_on("postgres")
def test_an_app_in_another_schema_never_holds_this_apps_keys(pg, pg_database):
    """Advisory locks are the database's: two apps in two schemas of one database
    lock their keys apart (the job table's oid is in the lock's hash)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    other = Conveyor(pg_schema_url(pg_database, schema))
    try:
        other.migrate()
        other.backend.job_insert_many(
            jobs=[ins(queue="qa", concurrency_key="k", concurrency_limit=1)]
        )
        pg.job_insert_many(jobs=[ins(queue="qa", concurrency_key="k", concurrency_limit=1)])
        with _claim_in_flight(pg, "qa") as held:
            assert len(held) == 1
            assert len(fetch(other.backend, 10, queues=("qa",), worker="w2")) == 1
    finally:
        other.close()
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@only_on("postgres")
def test_a_claim_locks_at_most_128_keys_and_leaves_the_rest(pg):
    pg.job_insert_many(
        jobs=[ins(queue="qa", concurrency_key=f"k{i}", concurrency_limit=1) for i in range(200)]
    )
    with pg.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
        cur.execute(pg.Q["limits_lock"], {"queue": "qa", "queue_lock": False})
        cur.execute(pg.Q["job_claim_candidates"], _params(pg, "qa", window=200))
        picked = [r["id"] for r in cur.fetchall()]
        cur.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory'"
            " AND pid = pg_backend_pid() AND classid = 72628375"
        )
        assert cur.fetchone()["n"] == 128
    assert len(picked) == 128
    # the first 128 in claim order; the others are claimable again
    claimed = fetch(pg, 200, queues=("qa",), worker="w2")
    assert len(claimed) == 128
    assert len(fetch(pg, 200, queues=("qa",), worker="w3")) == 72


@pytest.fixture
def my(backend):
    """The backend of a test of MySQL's key locks (named locks)."""
    return backend


@contextmanager
def _keys_held(my, *keys: str) -> Iterator[None]:
    """Another session holding the key locks a keyed claim takes (limits_lock_keys),
    as a claim in flight does until its COMMIT."""
    import json

    import pymysql

    from conveyor.backends.mysql.backend import parse_url

    conn = pymysql.connect(**parse_url(my.url), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(my.Q["limits_lock_keys"], {"keys": json.dumps(sorted(keys))})
            assert [got for _, got in cur.fetchall()] == [1] * len(keys)
        yield
    finally:
        conn.close()  # the session's named locks go with it


@only_on("mysql")
def test_mysql_claims_skip_the_keys_another_claim_holds(my):
    """MySQL's key locks are the session's (GET_LOCK), not the transaction's: a
    claim tries them without waiting and leaves out the candidates of keys held
    elsewhere, so a session lost with its locks can never stall other claims."""
    my.job_insert_many(jobs=[ins(queue="q", concurrency_key="a", concurrency_limit=1)])
    my.job_insert_many(jobs=[ins(queue="q", concurrency_key="b", concurrency_limit=1)])
    with _keys_held(my, "a"):
        assert [j.concurrency_key for j in fetch(my, 10, worker="w2")] == ["b"]
        assert fetch(my, 10, worker="w3") == []
    # released with their session; and each claim released its own after its COMMIT
    assert [j.concurrency_key for j in fetch(my, 10, worker="w3")] == ["a"]
    my.job_insert_many(jobs=[ins(queue="q", concurrency_key="b", concurrency_limit=2)])
    assert [j.concurrency_key for j in fetch(my, 10, worker="w4")] == ["b"]


@only_on("postgres")
def test_a_claim_counts_the_claims_committed_while_it_waited_for_the_queue_lock(pg):
    """The limited claim runs its statements in one function call, each with a
    snapshot of its own: one that waited for the queue's lock counts the jobs
    the claim holding it took. (With one snapshot for the whole call, taken
    before the wait, it would count none and take two more: 4 running of 2.)"""
    pg.queue_set_limit(name="qa", max_running=2)
    pg.job_insert_many(jobs=[ins(queue="qa") for _ in range(4)])
    with _claim_in_flight(pg, "qa", queue_lock=True, max_running=2) as held:
        assert len(held) == 2
        thread, got = _claim_in_thread(pg, "qa")
        _wait_for_a_queue_lock_waiter(pg)  # the thread's claim waits for the lock
    thread.join(10)
    assert got == [[]]
    assert len([j for j in fetch(pg, 10, queues=("qa",), worker="w3")]) == 0


def _wait_for_a_queue_lock_waiter(pg) -> None:
    """Until one claim waits for a queue's lock (limits_lock)."""
    with pg.pool.connection() as conn:
        for _ in range(500):
            [row] = conn.execute(
                "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory'"
                " AND classid = 72628374 AND NOT granted"
            ).fetchall()
            if row["n"]:
                break
            time.sleep(0.01)
        assert row["n"] == 1


@only_on("postgres")
def test_a_claim_under_a_queue_limit_alone_counts_and_skips_what_the_lock_holder_took(pg):
    """Under a queue limit alone the claim is one statement (job_claim sized by
    queue_room_function), whose own snapshot is taken before it waits for the
    queue's lock: the room is counted after the wait all the same, and the jobs the
    holder took, still waiting in that snapshot, are locked in their newest
    version and left out. 3 of 4 jobs may run; the holder took 2, so the waiter
    takes 1, a job the holder did not take."""
    pg.queue_set_limit(name="qa", max_running=3)
    pg.job_insert_many(jobs=[ins(queue="qa") for _ in range(4)])
    params = {**_params(pg, "qa"), "queues": ["qa"], "max_running": 3, "limit": 2}
    with pg.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
        cur.execute(CLAIM_LIMITED_FUNCTION)
        held = [r["id"] for r in cur.execute(QUEUE_LIMITED_CLAIM, params).fetchall()]
        assert len(held) == 2
        thread, got = _claim_in_thread(pg, "qa")
        _wait_for_a_queue_lock_waiter(pg)  # the thread's claim waits for the lock
    thread.join(10)
    [taken] = got
    assert len(taken) == 1 and taken[0].id not in held
    assert fetch(pg, 10, queues=("qa",), worker="w3") == []
    with pg.pool.connection() as conn:
        [row] = conn.execute(
            "SELECT count(*) AS n FROM conveyor_jobs WHERE queue = 'qa' AND state = 'running'"
        ).fetchall()
    assert row["n"] == 3


@only_on("postgres")
def test_a_session_that_lost_its_claim_function_makes_it_again(pg):
    """The limited claim's function is the session's own (pg_temp): a pooled
    connection whose temporary objects were dropped makes it again."""
    pg.queue_set_limit(name="qa", max_running=5)
    pg.job_insert_many(jobs=[ins(queue="qa") for _ in range(3)])
    assert len(fetch(pg, 1, queues=("qa",))) == 1  # made on this session
    with pg.pool.connection() as conn:  # the pool hands back the last one returned
        conn.execute("DISCARD TEMP")
    assert len(fetch(pg, 1, queues=("qa",))) == 1
    assert len(fetch(pg, 5, queues=("qa",))) == 1


@only_on("postgres")
def test_a_role_that_may_not_create_temporary_objects_claims_statement_by_statement(pg):
    """Without the TEMPORARY privilege the session cannot make the claim's
    function: limited claims then run its statements one by one, and still hold
    the limits (and spend the tokens)."""
    info = psycopg.conninfo.conninfo_to_dict(pg.url)
    role, db = f"conveyor_notemp_{uuid.uuid4().hex[:8]}", info["dbname"]
    schema = info["options"].split("=", 1)[1]
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'REVOKE TEMPORARY ON DATABASE "{db}" FROM PUBLIC')
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        conn.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        conn.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"')
    other = Conveyor(
        re.sub(r"^postgresql://[^@/]*@", f"postgresql://{role}@", pg.url), auto_migrate=False
    )
    try:
        pg.queue_set_limit(name="qa", max_running=2)
        pg.job_insert_many(jobs=[ins(queue="qa") for _ in range(3)])
        pg.job_insert_many(
            jobs=[
                ins(queue="qb", rate_key="r", rate_per_s=0.001, rate_burst=2.0),
                ins(queue="qb", rate_key="r", rate_per_s=0.001, rate_burst=2.0),
                ins(queue="qb", rate_key="r", rate_per_s=0.001, rate_burst=2.0),
                ins(queue="qb", concurrency_key="k", concurrency_limit=1),
                ins(queue="qb", concurrency_key="k", concurrency_limit=1),
            ]
        )
        assert len(fetch(other.backend, 10, queues=("qa",), worker="w2")) == 2
        assert fetch(other.backend, 10, queues=("qa",), worker="w2") == []
        assert not other.backend._temp_functions
        assert len(fetch(other.backend, 10, queues=("qb",), worker="w2")) == 3  # 2 tokens, 1 key
        assert fetch(other.backend, 10, queues=("qb",), worker="w2") == []
    finally:
        other.close()
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute(f'GRANT TEMPORARY ON DATABASE "{db}" TO PUBLIC')
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')
