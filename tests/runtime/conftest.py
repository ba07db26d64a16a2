"""Fixtures for tests that run real worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor import Conveyor

ROOT = Path(__file__).resolve().parents[2]


class Procs:
    def __init__(self, db_url: str, effects: Path) -> None:
        self.env = {**os.environ, "CONVEYOR_DATABASE_URL": db_url, "EFFECTS_FILE": str(effects)}
        self.effects = effects
        self.started: list[subprocess.Popen] = []

    def worker(self, **options) -> subprocess.Popen:
        options.setdefault("poll_s", 0.2)
        log = self.effects.with_name(f"worker-{len(self.started)}.log")
        with open(log, "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.runtime.procapp", json.dumps(options)],
                cwd=ROOT,
                env=self.env,
                stderr=err,
            )
        proc.log = log  # type: ignore[attr-defined]
        self.started.append(proc)
        return proc

    def lines(self, kind: str) -> list[tuple[int, int]]:
        if not self.effects.exists():
            return []
        rows = [ln.split() for ln in self.effects.read_text().splitlines()]
        return [(int(job), int(pid)) for k, job, pid in rows if k == kind]

    def drain_and_stop(self, producer: Conveyor, workers: list[subprocess.Popen]) -> None:
        """Wait until nothing is left to run and every worker has started (a
        SIGTERM while Python still imports the app kills the process: no handler
        yet), then SIGTERM the workers: each must exit 0 (a graceful stop)."""
        from .helpers import wait_for

        for w in workers:
            started = lambda w=w: " started: " in w.log.read_text()  # noqa: E731
            wait_for(started, timeout=60, what="worker started")
        active = ("available", "running", "scheduled")
        wait_for(
            lambda: not any(c.state in active and c.count for c in producer.counts()),
            timeout=120,
            what="all jobs done",
        )
        for w in workers:
            w.send_signal(signal.SIGTERM)
        assert [w.wait(20) for w in workers] == [0] * len(workers)

    def cleanup(self) -> None:
        for p in self.started:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def procs(db_url, tmp_path):
    p = Procs(db_url, tmp_path / "effects.log")
    yield p
    p.cleanup()


@pytest.fixture
def producer(db_url):
    app = Conveyor(db_url)
    for name in ("effect", "raced", "sleepy", "crash"):
        app.task(name=name)(lambda *a: None)
    yield app
    app.close()
