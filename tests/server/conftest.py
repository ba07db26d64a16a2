"""The real server: ``conveyor server`` (uvicorn) in a subprocess on a free
loopback port, against the test's database (SQLite and PostgreSQL), driven over
HTTP with httpx."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from conveyor import Conveyor
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.server.srvapp:app"


def wait_for(check: Callable[[], object], *, timeout: float = 60, what: str = "condition"):
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Server:
    def __init__(self, db_url: str, log: Path, args: list[str]) -> None:
        self.db_url = db_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        # ROOT first, then the caller's path: a worktree's src (PYTHONPATH=$PWD/src)
        # stays ahead of the installed package, so the server runs the code under test
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        env.pop("CONVEYOR_DATABASE_URL", None)
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "conveyor.cli.main",
                    "-d",
                    db_url,
                    "server",
                    "--port",
                    str(self.port),
                    *args,
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._up, timeout=60, what=f"the server on {self.url} (log: {log})")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the server exited: {self.log.read_text()}")
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def client(self, token: str | None = None, **kw) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kw)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def start_server(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """``start_server("--app", APP, ...)``: a real server; stopped after the test."""
    started: list[Server] = []

    def start(*args: str) -> Server:
        server = Server(db_url, tmp_path / f"server-{len(started)}.log", list(args))
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """``start_server`` on a SQLite file, whatever the backend: for what the
    database plays no part in (the HTTP perimeter)."""
    started: list[Server] = []

    def start(*args: str) -> Server:
        url = f"sqlite:///{tmp_path / 'conveyor.db'}"
        server = Server(url, tmp_path / f"server-{len(started)}.log", ["--app", APP, *args])
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def server(start_server) -> Server:
    return start_server("--app", APP)


@pytest.fixture
def api(server: Server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


@pytest.fixture
def producer(db_url: str) -> Iterator[Conveyor]:
    """A Python producer on the same database (no handlers: it sends by name)."""
    app = Conveyor(db_url)
    yield app
    app.close()
