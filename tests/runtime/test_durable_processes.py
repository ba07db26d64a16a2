"""Durable steps across real processes: a job that sleeps while its worker is
killed (-9) finishes on the next worker with each step run once, and a waiter is
woken by an event emitted from another process (the CLI)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor import Conveyor

from .conftest import ROOT
from .helpers import finished, wait_for

pytestmark = pytest.mark.slow

APP = "tests.runtime.durableapp:app"


class Cluster:
    def __init__(self, db_url: str, tmp: Path) -> None:
        self.effects = tmp / "effects.log"
        self.tmp = tmp
        self.env = {
            **os.environ,
            "CONVEYOR_DATABASE_URL": db_url,
            "EFFECTS_FILE": str(self.effects),
        }
        self.procs: list[subprocess.Popen] = []

    def conveyor(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "conveyor.cli.main", *args]

    def worker(self, *options: str) -> subprocess.Popen:
        cmd = self.conveyor("worker", "--app", APP, "--dead-after", "2", *options)
        with open(self.tmp / f"worker-{len(self.procs)}.log", "w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=log)
        self.procs.append(proc)
        return proc

    def effects_of(self, job_id: int) -> list[tuple[str, int]]:
        if not self.effects.exists():
            return []
        rows = [ln.split() for ln in self.effects.read_text().splitlines()]
        return [(kind, int(pid)) for kind, job, pid in rows if int(job) == job_id]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def cluster(db_url, tmp_path):
    app = Conveyor(db_url)
    app.migrate()
    app.close()
    c = Cluster(db_url, tmp_path)
    yield c
    c.stop()


@pytest.fixture
def producer(db_url):
    from tests.runtime import durableapp

    app = Conveyor(db_url)
    app.task(name=durableapp.sleeper.name)(durableapp.sleeper.fn)
    app.task(name=durableapp.awaiter.name)(durableapp.awaiter.fn)
    yield app
    app.close()


def test_a_sleeping_job_survives_a_killed_worker_and_runs_each_step_once(cluster, producer):
    job = producer.tasks["sleeper"].send(4.0)
    first = cluster.worker()
    # asleep: its first step stored, no worker holding it (scheduled, not running)
    wait_for(
        lambda: cluster.effects_of(job.id) and producer.get_job(job.id).state == "scheduled",
        timeout=60,
        what="the job asleep",
    )
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert cluster.effects_of(job.id) == [("sleeper-one", first.pid)]
    second = cluster.worker()
    wait_for(finished(producer, job.id), timeout=90, what="the job finished")
    done = producer.get_job(job.id)
    assert done.state == "succeeded", done.error
    assert done.result == ["sleeper-one", "sleeper-two"]
    assert cluster.effects_of(job.id) == [("sleeper-one", first.pid), ("sleeper-two", second.pid)]
    assert [a.outcome for a in producer.job_attempts(job.id)] == ["snoozed", "succeeded"]
    assert done.attempts == 1


def test_a_waiter_is_woken_by_an_event_from_another_process(cluster, producer):
    job = producer.tasks["awaiter"].send("paid:7")
    cluster.worker()
    wait_for(
        lambda: producer.get_job(job.id).state == "scheduled", timeout=60, what="the job waiting"
    )
    emit = cluster.conveyor("events", "emit", "paid:7", "--payload", '{"amount": 30}', "--json")
    out = subprocess.run(emit, cwd=ROOT, env=cluster.env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"key": "paid:7", "created": True, "woken": 1}
    wait_for(finished(producer, job.id), timeout=60, what="the job finished")
    done = producer.get_job(job.id)
    assert (done.state, done.result) == ("succeeded", {"amount": 30})
    assert [k for k, _ in cluster.effects_of(job.id)] == ["awaiter-one", "awaiter-two"]
    again = subprocess.run(emit, cwd=ROOT, env=cluster.env, capture_output=True, text=True)
    assert json.loads(again.stdout) == {"key": "paid:7", "created": False, "woken": 0}


def test_durable_steps_in_handler_processes(cluster, producer):
    """``--processes``: the handler runs in a child process, which stores its steps
    through its own connection; its sleep and wait end the parent's attempt."""
    sleeper = producer.tasks["sleeper"].send(0.5)
    waiter = producer.tasks["awaiter"].send("paid:proc")
    cluster.worker("--processes", "1")
    wait_for(lambda: producer.get_job(waiter.id).state == "scheduled", timeout=60, what="the wait")
    assert producer.emit_event("paid:proc", [1, 2]).woken == 1
    wait_for(finished(producer, sleeper.id, waiter.id), timeout=60, what="both finished")
    assert producer.get_job(sleeper.id).result == ["sleeper-one", "sleeper-two"]
    assert producer.get_job(waiter.id).result == [1, 2]
    assert [k for k, _ in cluster.effects_of(sleeper.id)] == ["sleeper-one", "sleeper-two"]
    assert [k for k, _ in cluster.effects_of(waiter.id)] == ["awaiter-one", "awaiter-two"]
