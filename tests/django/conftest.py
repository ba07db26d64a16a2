"""A real Django project (project/, shop/) on one database per run: DJANGO_TEST_DB
is sqlite, postgres or mysql (the servers of CONVEYOR_TEST_POSTGRES_URL and
CONVEYOR_TEST_MYSQL_URL). A database of its own is made for the run and dropped
after; ``manage.py migrate`` and ``manage.py conveyor_worker`` run as real
processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

HERE = Path(__file__).resolve().parent
DB = os.environ.get("DJANGO_TEST_DB", "sqlite")
PG_URL = os.environ.get(
    "CONVEYOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
MYSQL_URL = os.environ.get("CONVEYOR_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/mysql")
NAME = f"conveyor_dj_{os.getpid()}_{uuid.uuid4().hex[:6]}"
_scratch = tempfile.TemporaryDirectory(prefix="conveyor-django-")


def _server(url: str) -> dict[str, str]:
    parts = urlsplit(url)
    return {
        "DJANGO_DB_USER": unquote(parts.username or ""),
        "DJANGO_DB_PASSWORD": unquote(parts.password or ""),
        "DJANGO_DB_HOST": parts.hostname or "127.0.0.1",
        "DJANGO_DB_PORT": str(parts.port or ""),
    }


def _admin(sql: str) -> None:
    """Run a statement on the server as the test URL's user, outside any database we make."""
    if DB == "postgres":
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql)
    else:
        import MySQLdb

        s = _server(MYSQL_URL)
        conn = MySQLdb.connect(
            host=s["DJANGO_DB_HOST"],
            port=int(s["DJANGO_DB_PORT"] or 3306),
            user=s["DJANGO_DB_USER"] or "root",
            password=s["DJANGO_DB_PASSWORD"],
            connect_timeout=5,
        )
        try:
            conn.cursor().execute(sql)
        finally:
            conn.close()


def _database_env() -> dict[str, str]:
    if DB == "sqlite":
        return {"DJANGO_DB_ENGINE": "sqlite3", "DJANGO_DB_NAME": f"{_scratch.name}/db.sqlite3"}
    if DB == "postgres":
        _admin(f'CREATE DATABASE "{NAME}"')
        return {"DJANGO_DB_ENGINE": "postgresql", "DJANGO_DB_NAME": NAME, **_server(PG_URL)}
    if DB == "mysql":
        _admin(f"CREATE DATABASE `{NAME}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        return {"DJANGO_DB_ENGINE": "mysql", "DJANGO_DB_NAME": NAME, **_server(MYSQL_URL)}
    raise pytest.UsageError(f"DJANGO_TEST_DB must be sqlite, postgres or mysql, got {DB!r}")


def pytest_configure(config: pytest.Config) -> None:
    os.environ.update(_database_env())
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    sys.path.insert(0, str(HERE))
    import django

    django.setup()


def pytest_unconfigure(config: pytest.Config) -> None:
    from django.db import connections

    connections.close_all()
    from conveyor.contrib.django import database

    for app in database._apps.values():
        app.close()
    if DB == "postgres":
        _admin(f'DROP DATABASE IF EXISTS "{NAME}" WITH (FORCE)')
    elif DB == "mysql":
        _admin(f"DROP DATABASE IF EXISTS `{NAME}`")
    _scratch.cleanup()


def manage(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python manage.py ARGS`` in the test project, as a real process."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: every worker's --dead-after: the leader judges every worker by its own, so they
#: must agree (a worker heartbeats every third of it); short, for the SIGKILL test
DEAD_AFTER = "3"


class WorkerProcess:
    """``manage.py conveyor_worker ARGS`` running until stopped (SIGTERM) or killed."""

    def __init__(self, *args: str) -> None:
        args = (*args, "--dead-after", DEAD_AFTER)
        self.log = Path(_scratch.name) / f"worker-{uuid.uuid4().hex[:6]}.log"
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "conveyor_worker", *args],
            cwd=HERE,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        self._out.close()
        return code

    def wait(self, timeout: float) -> int:
        """The exit status of a worker that stops by itself (--burst)."""
        code = self.proc.wait(timeout)
        self._out.close()
        return code

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._out.close()

    def output(self) -> str:
        return self.log.read_text()


def wait_until(check: Callable[[], object], timeout: float = 30, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        time.sleep(0.1)


@pytest.fixture(scope="session", autouse=True)
def migrated() -> None:
    """``manage.py migrate``, once: Django's tables and Conveyor's."""
    done = manage("migrate", "--no-input")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Applying conveyor.0001_conveyor_schema... OK" in done.stdout


@pytest.fixture(scope="session")
def worker(migrated: None) -> Iterator[WorkerProcess]:
    """A worker for the default and emails queues, for the session."""
    w = WorkerProcess("--queues", "default,emails", "--concurrency", "4")
    # running, its signal handlers in place: a SIGTERM then stops it gracefully
    wait_until(lambda: " started: queues=" in w.output(), 60, "the worker to start")
    yield w
    assert w.stop() == 0, w.output()
