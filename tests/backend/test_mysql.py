"""MySQL/MariaDB only: what the dialect does that the others have no need to
(deadlock retries, the change-number horizon, URL forms)."""

from __future__ import annotations

import gc
import os
import re
import sys
import threading
import uuid

import pytest

from conveyor.backends import open_backend
from conveyor.backends.mysql.backend import MySQLBackend, parse_url
from conveyor.backends.mysql.session import poll_seconds
from conveyor.errors import ConfigError
from conveyor.records import JobFilter

from .helpers import done, ins, raw_connection


@pytest.fixture
def mysql(mysql_base: str):
    from tests.conftest import _mysql_connect, mysql_database_url

    name = f"conveyor_t_{uuid.uuid4().hex[:12]}"
    with _mysql_connect(mysql_base) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    backend = open_backend(mysql_database_url(mysql_base, name))
    assert isinstance(backend, MySQLBackend)
    backend.migrate()
    yield backend
    backend.close()
    with _mysql_connect(mysql_base) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")


def test_url_forms():
    a = parse_url("mysql://app:p%40ss@db.example:3307/jobs?connect_timeout=3")
    assert (a["user"], a["password"], a["host"], a["port"], a["database"]) == (
        "app",
        "p@ss",
        "db.example",
        3307,
        "jobs",
    )
    assert a["connect_timeout"] == 3.0
    assert parse_url("mariadb://root@127.0.0.1/x")["port"] == 3306
    with pytest.raises(ConfigError, match="names no database"):
        parse_url("mysql://root@127.0.0.1:3306/")
    with pytest.raises(ConfigError, match="unknown MySQL URL option"):
        parse_url("mysql://root@h/db?sslmode=x")
    assert "poll_ms" not in parse_url("mysql://root@h/db?poll_ms=20")  # not PyMySQL's
    assert poll_seconds("mysql://root@h/db") == 0.002
    assert poll_seconds("mysql://root@h/db?poll_ms=20") == 0.02
    for bad in ("0", "5000", "soon"):
        with pytest.raises(ConfigError, match="poll_ms must be 1 to 1000"):
            poll_seconds(f"mysql://root@h/db?poll_ms={bad}")


def test_the_urls_poll_ms_sets_the_notifiers_cadence(mysql):
    slower = open_backend(mysql.url + ("&" if "?" in mysql.url else "?") + "poll_ms=25")
    try:
        notifier = slower.notifier()
        assert notifier._fast == 0.025
        notifier.close()
    finally:
        slower.close()


def test_a_deadlock_is_retried_whole_and_counted(mysql):
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise mysql._driver.OperationalError(1213, "Deadlock found when trying to get lock")
        return "ok"

    before = mysql.deadlock_retries
    assert mysql._retrying(flaky) == "ok" and len(calls) == 3
    assert mysql.deadlock_retries == before + 2
    error = mysql._driver.OperationalError
    with pytest.raises(error):  # anything else is not retried
        mysql._retrying(lambda: (_ for _ in ()).throw(error(1146, "x")))


def test_shared_operations_reach_the_retry_by_the_hook_but_in_a_callers_transaction(
    mysql, monkeypatch
):
    """A shared operation that is one transaction of ours (SqlBackend's ``retried``)
    runs inside MySQL's retry, the ``_retrying`` hook; inside a caller's
    transaction (conn=) it runs once, the retry being the caller's."""
    outer = []
    retrying = mysql._retrying

    def spy(run):
        outer.append(run)
        return retrying(run)

    monkeypatch.setattr(mysql, "_retrying", spy)
    for op in (
        lambda: mysql.queue_set_paused(name="q", paused=True),
        lambda: mysql.job_insert_many(jobs=[ins()]),
        lambda: mysql.batch_create(
            name=None, task="t", idempotency_key=None, on_complete_json=None, jobs=[ins()]
        ),
        lambda: mysql.job_cancel_many(filter=JobFilter(queues=["q"])),
    ):
        before = len(outer)
        op()
        assert len(outer) > before
    with raw_connection(mysql) as conn:
        before = len(outer)
        [inserted] = mysql.job_insert_many(jobs=[ins()], conn=conn)
        assert len(outer) == before and inserted.created


def test_racing_workers_run_every_job_once_and_deadlocks_are_counted(mysql):
    """Eight threads (each its own connection) claim and finish 600 jobs, some of
    them keyed (limited claims), while an operator retries and cancels: every job
    ends exactly once; deadlocks and lock wait timeouts, if any, were retried."""
    mysql.job_insert_many(jobs=[ins(args=[i]) for i in range(500)])
    mysql.job_insert_many(
        jobs=[
            ins(queue="k", args=[i], concurrency_key=f"k{i % 5}", concurrency_limit=2)
            for i in range(100)
        ]
    )
    finished: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            idle = 0
            while idle < 20:
                jobs = mysql.job_claim(queues=["q", "k"], worker_id=f"w{n}", limit=7)
                if not jobs:
                    idle += 1
                    continue
                idle = 0
                ok = mysql.job_finalize_many(worker_id=f"w{n}", outcomes=[done(j) for j in jobs])
                with lock:
                    finished.extend(ok)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(finished) == len(set(finished)) == 600
    assert mysql.job_count(filter=JobFilter()) == {"succeeded": 600}
    # the count is there to be read (a figure for the report), and stays bounded:
    # far fewer retries than transactions
    print(f"deadlock/lock-wait retries under 8 racing workers: {mysql.deadlock_retries}")
    assert 0 <= mysql.deadlock_retries < 600


def test_an_open_transaction_holds_the_change_horizon(mysql):
    head = mysql.changes_head()
    conn = raw_connection(mysql)
    try:
        mysql.job_insert_many(jobs=[ins()], conn=conn)  # takes a change number, open
        mysql.job_insert_many(jobs=[ins()])  # a later number, committed
        assert mysql.changes_since(after=head, filter=JobFilter()) == []
        conn.commit()
        assert len(mysql.changes_since(after=head, filter=JobFilter())) == 2
    finally:
        conn.close()
    mysql.counts_fold()  # prunes the numbers no reader needs: the next ones go on
    mysql.job_insert_many(jobs=[ins()])
    assert len(mysql.changes_since(after=head, filter=JobFilter())) == 3


def test_a_send_wakes_a_notifier_in_the_same_process_at_once(mysql):
    """No LISTEN/NOTIFY: the commit hints this process's notifiers directly
    (other processes poll the change index)."""
    import time

    notifier = mysql.notifier()
    try:
        notifier.wait(0.05)  # drain
        began = time.monotonic()
        mysql.job_insert_many(jobs=[ins(queue="mail")])
        hints = notifier.wait(5)
        assert "mail" in hints and time.monotonic() - began < 1.0
        conn = raw_connection(mysql)  # in the caller's transaction: hinted at once
        try:
            mysql.job_insert_many(jobs=[ins(queue="late")], conn=conn)
            assert "late" in notifier.wait(5)
            conn.commit()
        finally:
            conn.close()
    finally:
        notifier.close()


def test_another_process_is_noticed_by_polling(mysql):
    """A commit from another connection, which the hub does not see, is noticed
    by the notifier's poll of the change index."""
    other = open_backend(mysql.url)
    notifier = mysql.notifier()
    try:
        from conveyor.backends.mysql import backend as mod

        mod.HUB._notifiers.clear()  # as if the sender were another process
        notifier.wait(0.05)
        other.job_insert_many(jobs=[ins(queue="mail")])
        assert notifier.wait(5) == {"*"}
    finally:
        notifier.close()
        other.close()


def test_the_urls_driver_option_is_checked_before_any_connection():
    # (no server at this port: the option is refused first, naming itself)
    with pytest.raises(ConfigError, match="driver must be one of pymysql, mysqlclient"):
        open_backend("mysql://root@127.0.0.1:1/jobs?driver=mysql-connector")


def test_driver_mysqlclient_without_the_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "MySQLdb", None)  # import MySQLdb raises ImportError
    monkeypatch.setitem(sys.modules, "MySQLdb.cursors", None)
    with pytest.raises(ConfigError, match=r"pip install 'conveyor\[mysqlclient\]'"):
        open_backend("mysql://root@127.0.0.1:1/jobs?driver=mysqlclient")


def _with_driver(url: str, name: str) -> str:
    base = re.sub(r"[?&]driver=[^&]*", "", url)
    return base + ("&" if "?" in base else "?") + f"driver={name}"


@pytest.mark.parametrize("name", ["pymysql", "mysqlclient"])
def test_each_driver_serves_the_backend_and_a_forked_child_leaves_the_parents_session(mysql, name):
    """The URL's driver makes every connection, and a forked child that forgets
    the parent's connections does not end the parent's sessions: mysqlclient
    sends a QUIT when it collects a connection, which on the parent's socket
    would close the parent's session under it."""
    module = "pymysql" if name == "pymysql" else "MySQLdb"
    if name == "mysqlclient":
        pytest.importorskip("MySQLdb")
    backend = open_backend(_with_driver(mysql.url, name))
    try:
        assert type(backend._conn()).__module__.split(".")[0] == module
        [job] = backend.job_insert_many(jobs=[ins("t", queue="q")])
        before = backend._rows("session_id", {}, sql="SELECT CONNECTION_ID() AS id")
        pid = os.fork()
        if pid == 0:  # the child: forget the parent's connections, collect them, leave
            code = 1
            try:
                backend._after_fork()
                gc.collect()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        after = backend._rows("session_id", {}, sql="SELECT CONNECTION_ID() AS id")
        assert after == before  # the same session, still open
        [claimed] = backend.job_claim(queues=["q"], worker_id="w", limit=1)
        assert claimed.id == job.id
    finally:
        backend.close()


def test_threads_share_one_dirty_reader_for_the_change_horizon(mysql):
    """A threaded server's threads each hold a connection; the READ UNCOMMITTED
    reader of the change horizon is one for them all (one each held twice the
    threads' connections: 95 for one `conveyor server` under 64 clients)."""
    ready, done = threading.Barrier(9), threading.Barrier(9)

    def read() -> None:
        mysql._conn()  # a thread that wrote or read (the server's do) holds one
        mysql._horizon()
        ready.wait()  # all eight alive at once: none hands its connection on
        done.wait()

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    ready.wait()
    try:
        [row] = mysql._rows(
            "sessions",
            {"db": mysql.database},
            sql="SELECT count(*) AS n FROM information_schema.processlist WHERE db = %(db)s",
        )
    finally:
        done.wait()
        for t in threads:
            t.join()
    # the eight threads', this thread's and the one reader
    assert row["n"] == 8 + 1 + 1
