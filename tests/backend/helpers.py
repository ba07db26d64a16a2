"""Building blocks of the conformance suite: every backend verb, on every dialect,
with time passed in (``now``) so expiry and scheduling need no sleeping."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import psycopg
import pymysql

from conveyor.records import Finalize, JobInsert, WorkerInfo

CALLBACK = None  # set below, once ins() exists


def ins(task: str = "t", queue: str = "q", **kw) -> JobInsert:
    args = kw.pop("args", [])
    return JobInsert(
        queue=queue, task=task, args_json=json.dumps({"args": args, "kwargs": {}}), **kw
    )


def later(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def worker(wid: str = "w1", **kw) -> WorkerInfo:
    kw.setdefault("queues", ["q"])
    return WorkerInfo(id=wid, hostname="h", pid=1, concurrency=4, **kw)


def register(backend, wid: str = "w1", now=None, **kw):
    """A heartbeat: the worker is alive (as of ``now``)."""
    return backend.worker_heartbeat(worker=worker(wid, **kw), now=now)


def fetch(backend, n: int = 10, queues=("q",), worker: str = "w1", now=None, **kw):
    return backend.job_claim(queues=list(queues), worker_id=worker, limit=n, now=now, **kw)


def keyed_claim_params(
    backend,
    queue: str = "q",
    limit: int = 100,
    factor: int = 2,
    worker: str = "w",
    ids: list[int] | None = None,
    **kw,
) -> dict:
    """The parameters of a keyed claim's statements (job_claim_candidates, then
    job_claim_limited by ``ids``), as the backend sends them; ``kw`` overrides."""
    from conveyor.backends.sql.logic import QueueLimits, limited_params

    return {
        "worker_id": worker,
        "lease_s": None,
        "now": None,
        "tasks": None,
        "schema_version": backend.latest_schema,
        "limit": limit,
        "identity": [worker],
        "ids": ids or [],
        **limited_params(queue, QueueLimits(None, None, None, keyed=True), limit, factor),
        **kw,
    }


def pg_setting(conn, name: str) -> str:
    """A PostgreSQL setting as the connection's session sees it now."""
    row = conn.execute("SELECT current_setting(%s) AS s", (name,)).fetchone()
    return str(row["s"] if isinstance(row, dict) else row[0])


def done(job, state: str = "succeeded", token: str | None = None, **kw) -> Finalize:
    return Finalize(
        job_id=job.id,
        token=token if token is not None else job.lease_token,
        state=state,
        outcome=kw.pop("outcome", state),
        ran_attempt=kw.pop("ran_attempt", job.attempts),
        **kw,
    )


class _MySQLConnection(pymysql.connections.Connection):
    """A PyMySQL connection that also answers ``conn.execute(sql)`` like the
    sqlite3 and psycopg connections the tests use, and commits on ``with`` exit."""

    def execute(self, sql, params=None):
        cur = self.cursor()
        cur.execute(sql.replace("?", "%s"), params)
        return cur

    def __exit__(self, *exc):
        if exc[0] is None:
            self.commit()
        self.close()


def raw_connection(backend):
    if backend.name == "postgres":
        return psycopg.connect(backend.url)
    if backend.name == "mysql":
        from conveyor.backends.mysql.backend import parse_url

        return _MySQLConnection(**parse_url(backend.url))
    return sqlite3.connect(backend.path)


@contextmanager
def backend_at_schema(db_url: str, monkeypatch, version: int) -> Iterator[tuple[object, Callable]]:
    """A backend of ``db_url`` migrated only up to ``version``, and ``upgrade(to)``,
    which runs the migrations after it up to ``to`` (all of them when None) and
    returns the versions it applied: an upgrade over data the old schema wrote."""
    from conveyor.backends import open_backend

    first = open_backend(db_url)
    cls = type(first)
    first.close()
    every = cls.MIGRATIONS
    monkeypatch.setattr(cls, "MIGRATIONS", every[:version])
    old = open_backend(db_url)

    def upgrade(to: int | None = None) -> list[int]:
        monkeypatch.setattr(cls, "MIGRATIONS", every if to is None else every[:to])
        return old.migrate()

    try:
        old.migrate()
        yield old, upgrade
    finally:
        old.close()


CALLBACK = json.dumps(ins(task="summarise", queue="callbacks")._asdict())


def make_batch(backend, n=3, key=None, on_complete=CALLBACK, name="b"):
    return backend.batch_create(
        name=name,
        task="t",
        idempotency_key=key,
        on_complete_json=on_complete,
        jobs=[ins(args=[i]) for i in range(n)],
    )


def finish_all(backend, state="succeeded"):
    jobs = fetch(backend, n=1000)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(j, state=state) for j in jobs])
    return jobs
