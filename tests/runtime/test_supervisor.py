"""``conveyor worker --processes N``: handlers in child processes under a parent
that holds the jobs. Whatever a handler does to its process fails that attempt,
naming the exit code or signal; the child is replaced; the parent goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor import Conveyor
from conveyor.records import JobState
from conveyor.registry import user_tasks

from . import crashapp
from .helpers import finished, wait_for

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.runtime.crashapp:app"

pytestmark = pytest.mark.slow


@pytest.fixture
def producer(db_url):
    app = Conveyor(db_url)
    for task in user_tasks(crashapp.app.tasks):  # the same task names, to send them
        name = task.name
        app.task(name=name, max_attempts=task.defaults.max_attempts, timeout=task.defaults.timeout)(
            task.fn
        )
    yield app
    app.close()


@pytest.fixture
def worker(db_url, tmp_path):
    procs: list[subprocess.Popen] = []

    def start(*options: str) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
        env["PYTHONPATH"] = str(ROOT)
        env["CONVEYOR_DATABASE_URL"] = db_url
        path = tmp_path / f"worker-{len(procs)}.log"
        with open(path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "conveyor.cli.main", "worker", "--app", APP, *options],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        proc.log = path  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_crashing_handlers_fail_their_attempts_and_the_parent_goes_on(producer, worker, tmp_path):
    t = producer.tasks
    crashes = {
        "segfault": t["segfault"].send(),
        "abort": t["abort"].send(),
        "exit 3": t["exits"].send(3),
        "exit 0": t["exits"].send(0),
        "os._exit": t["hard_exit"].send(),
    }
    fine = t["double"].send_many([(i,) for i in range(20)]) + t["adouble"].send_many(
        [(i,) for i in range(5)]
    )
    proc = worker("--processes", "2", "--concurrency", "2")
    ids = [j.id for j in (*crashes.values(), *fine)]
    wait_for(finished(producer, *ids), timeout=90, what="every job finished")
    assert proc.poll() is None, "the parent died with its children"
    errors = {name: producer.get_job(j.id).error for name, j in crashes.items()}
    assert "killed by SIGSEGV" in errors["segfault"]
    assert "killed by SIGABRT" in errors["abort"]
    assert "SystemExit: 3" in errors["exit 3"] and "SystemExit: 0" in errors["exit 0"]
    assert "exited with status 7" in errors["os._exit"]
    assert all(producer.get_job(j.id).state == JobState.FAILED for j in crashes.values())
    assert [producer.get_job(j.id).result for j in fine] == [2 * j.args[0] for j in fine]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0


def test_a_job_past_its_timeout_or_memory_limit_is_really_stopped(producer, worker, tmp_path):
    marker = tmp_path / "side-effect"
    over = producer.tasks["overrun"].send(str(marker))
    hog = producer.tasks["hog"].send()
    proc = worker("--processes", "2", "--max-memory", "200")
    wait_for(finished(producer, over.id, hog.id), timeout=60)
    got_over, got_hog = producer.get_job(over.id), producer.get_job(hog.id)
    assert got_over.state == JobState.FAILED and "its process was killed" in got_over.error
    assert got_hog.state == JobState.FAILED and "over the 200 MB limit" in got_hog.error
    import time

    time.sleep(3)  # long after the overrunning handler would have written its marker
    assert not marker.exists(), "a job ran on after its attempt was recorded as ended"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0


def test_a_killed_child_is_retried_on_a_new_one(producer, worker, tmp_path):
    job = producer.tasks["crash_once"].send(str(tmp_path / "crashed-once"))
    proc = worker("--processes", "1")
    wait_for(finished(producer, job.id), timeout=60)
    got = producer.get_job(job.id)
    assert (got.state, got.result, got.attempts) == (JobState.SUCCEEDED, "second time lucky", 2)
    assert "killed by SIGKILL" in got.attempt_log()[0].error
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
