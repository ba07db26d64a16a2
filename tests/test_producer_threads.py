"""More producer threads than PostgreSQL's pool has connections, all sending at
once, as a threaded web app does: every send, send_many, batch and conn= send
completes, with the task's settings applied (issue 36, item 2).

Before, a bulk send (send_many, batch) held its pooled connection for the
COPY while the settings cache, asked for each chunk, took a second one: once
every connection was so held, none proceeded, and 30 s later every thread got
``couldn't get a connection`` and no batch existed."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable

import psycopg
import pymysql
import pytest

from conveyor import Conveyor

#: more than the pool's 10 connections (PostgresBackend's max_connections)
THREADS = 24
#: over STREAM_CHUNK, so that send_many takes the streaming path
BULK = 150


def _connect(app: Conveyor):
    backend = app.backend
    if backend.name == "postgres":
        return psycopg.connect(backend.url)
    if backend.name == "mysql":
        from conveyor.backends.mysql.backend import parse_url

        return pymysql.connect(**parse_url(backend.url))
    conn = sqlite3.connect(backend.path, timeout=60, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")  # SQLite's one writer: taken up front, as a writer should
    return conn


def _sends_in_a_transaction(app: Conveyor, n: int) -> None:
    task = app.tasks["add"]
    conn = _connect(app)
    try:
        task.send(n, conn=conn)
        task.send_many([(n,)] * (BULK - 1), conn=conn)
        conn.commit()
    finally:
        conn.close()


def _items_that_read(app: Conveyor, n: int) -> None:
    """send_many of an iterator of the caller's that reads the database as it goes."""
    app.tasks["add"].send_many((app.get_task_settings("add").max_attempts,) for _ in range(BULK))


PRODUCE: dict[str, tuple[Callable[[Conveyor, int], object], int]] = {
    "send": (lambda app, n: [app.tasks["add"].send(n) for _ in range(5)], 5),
    "send_many": (lambda app, n: app.tasks["add"].send_many([(n,)] * BULK), BULK),
    "send_many_iterator": (_items_that_read, BULK),
    "send_many_tenant_function": (lambda app, n: app.tasks["add"].send_many([(n,)] * BULK), BULK),
    "batch": (lambda app, n: app.tasks["add"].batch([(n,)] * BULK), BULK),
    "conn": (_sends_in_a_transaction, BULK),
}


def _tenant(app: Conveyor) -> Callable[[int], str]:
    """A tenant function that reads the database (any code of the caller's may)."""
    return lambda x: app.get_task_settings("add").task


@pytest.mark.parametrize("how", sorted(PRODUCE))
def test_more_threads_than_pooled_connections_all_send(app, how):
    tenant = _tenant(app) if how == "send_many_tenant_function" else None
    app.task(name="add", tenant_key=tenant)(lambda x: x)
    app.connect()
    # Settings to apply to every job; setting them empties the settings cache, so
    # every thread's send finds it cold, as after its two seconds are up.
    app.set_task_settings("add", max_attempts=3)
    produce, per_thread = PRODUCE[how]
    start = threading.Barrier(THREADS)
    failed: list[BaseException] = []

    def producer(n: int) -> None:
        try:
            start.wait(30)
            produce(app, n)
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not [t for t in threads if t.is_alive()], "producers still waiting after 120 s"
    assert not failed, failed[:3]
    assert app.count_jobs(task="add") == {"available": THREADS * per_thread}
    attempts = {j.max_attempts for j in app.list_jobs(task="add", limit=10_000)}
    assert attempts == {3}, "the task's settings were not applied"
    if how == "batch":
        assert len(app.list_batches(limit=100)) == THREADS
