"""Helpers for the CLI tests: run the real ``cli`` in process, or as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from conveyor import Conveyor
from conveyor.cli.main import cli

from . import cliapp

ROOT = Path(__file__).resolve().parents[2]
TEST_APP = "tests.cli.cliapp:app"

Invoke = Callable[..., Result]


@pytest.fixture(autouse=True)
def _no_conveyor_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's own CONVEYOR_* settings must not leak into what the tests check.
    monkeypatch.delenv("CONVEYOR_DATABASE_URL", raising=False)
    monkeypatch.delenv("CONVEYOR_APP", raising=False)


@pytest.fixture
def invoke() -> Invoke:
    """``invoke("status", "--json", url=db_url)``: run the CLI in process."""

    def run(*args: str, url: str | None = None, env: dict[str, str] | None = None) -> Result:
        argv: list[str] = (["-d", url] if url else []) + list(args)
        return CliRunner().invoke(cli, argv, env=env, catch_exceptions=False)

    return run


def subprocess_env() -> dict[str, str]:
    """Environment for `conveyor` subprocesses: the test app importable, no stray settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def conveyor_cmd(*args: str) -> Sequence[str]:
    return [sys.executable, "-m", "conveyor.cli.main", *args]


StartWorker = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def start_worker(db_url: str, tmp_path: Path) -> Iterator[StartWorker]:
    """Start `conveyor worker` subprocesses; stderr goes to tmp_path/worker.log."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*options: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / "worker.log", "wb") as log:
            proc = subprocess.Popen(
                conveyor_cmd("-d", db_url, "worker", "--app", TEST_APP, *options),
                env=subprocess_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:  # a failed test must not leave workers running
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture
def producer(app: Conveyor) -> Conveyor:
    """The test database's app with the test tasks registered (to send them)."""
    return cliapp.register(app)
