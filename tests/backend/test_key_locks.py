"""Keyed claims lock their keys, not every key: a limited claim tries a lock on
each of its candidates' concurrency and rate keys (at most 128) and leaves out
the candidates of keys another claim holds, as SKIP LOCKED leaves rows out. So a
key shared by two queues is never counted by two claims at once (never
over-admitted), and claims never wait on each other's keys. (A claim in flight is
held open here, its transaction not committed, as a worker between its claim and
its COMMIT.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from conveyor.backends.sql.logic import QueueLimits, queue_spends

from .helpers import fetch, ins, keyed_claim_params


@pytest.fixture
def pg(backend):
    if backend.name != "postgres":
        pytest.skip("the key locks are PostgreSQL's advisory locks")
    return backend


def _params(pg, queue: str, window: int = 10) -> dict[str, Any]:
    return pg._params(
        keyed_claim_params(pg, queue, limit=10, factor=1, worker="held", window=window)
    )


@contextmanager
def _claim_in_flight(pg, queue: str) -> Iterator[list[Any]]:
    """A keyed claim of ``queue`` as the backend makes it, left uncommitted."""
    params = _params(pg, queue)
    with pg.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
        cur.execute(pg.Q["limits_lock"], {"queue": queue, "queue_lock": False})
        cur.execute(pg.Q["job_claim_candidates"], params)
        ids = [r["id"] for r in cur.fetchall()]
        cur.execute(pg.Q["job_claim_limited"], {**params, "ids": ids})
        claimed = list(cur.fetchall())
        for spend in queue_spends(queue, QueueLimits(None, None, None, keyed=True), claimed):
            cur.execute(pg.Q["rate_spend"], {**spend, "now": None})
        yield claimed


def _claim_in_thread(pg, queue: str) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []
    thread = threading.Thread(
        target=lambda: got.append(fetch(pg, 10, queues=(queue,), worker="w2")), daemon=True
    )
    thread.start()
    return thread, got


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


def test_an_app_in_another_schema_never_holds_this_apps_keys(pg, pg_database):
    """Advisory locks are the database's: two apps in two schemas of one database
    lock their keys apart (the job table's oid is in the lock's hash)."""
    import uuid

    import psycopg

    from conveyor import Conveyor

    from ..conftest import pg_schema_url

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
    if backend.name != "mysql":
        pytest.skip("the named key locks are MySQL's")
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
