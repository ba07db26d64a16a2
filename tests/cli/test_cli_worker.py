"""`conveyor worker` as a real process: runs jobs, stops gracefully on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conveyor import Conveyor, Job, JobState
from tests.ports import free_port

from .conftest import Invoke, StartWorker, conveyor_cmd, subprocess_env

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} INFO +conveyor\.worker: worker \S+ ")


def wait_for(job: Job, state: JobState, timeout: float = 20.0) -> Job:
    deadline = time.monotonic() + timeout
    while (current := job.refresh()).state != state:
        assert time.monotonic() < deadline, f"job {job.id} still {current.state}, wanted {state}"
        time.sleep(0.05)
    return current


def test_runs_jobs_and_stops_on_sigterm(
    start_worker: StartWorker, producer: Conveyor, invoke: Invoke, db_url: str, tmp_path: Path
) -> None:
    proc = start_worker("--queues", "default", "--concurrency", "4")
    jobs = producer.tasks["add"].send_many([(i, i) for i in range(10)])
    for job in jobs:
        assert job.wait(timeout=20).result == job.args[0] * 2

    workers = json.loads(invoke("status", "--json", url=db_url).stdout)["workers"]
    assert [(w["pid"], w["queues"], w["concurrency"]) for w in workers] == [
        (proc.pid, ["default"], 4)
    ]

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    log = (tmp_path / "worker.log").read_text()
    assert "Traceback" not in log
    lines = log.splitlines()
    assert LOG_LINE.match(lines[0]) and "started: queues=default concurrency=4" in lines[0]
    assert "stopped: 10 succeeded" in log
    # The worker said goodbye: status no longer lists it.
    assert json.loads(invoke("status", "--json", url=db_url).stdout)["workers"] == []


def test_sigterm_releases_a_running_job(
    start_worker: StartWorker, producer: Conveyor, invoke: Invoke, db_url: str, tmp_path: Path
) -> None:
    job = producer.tasks["sleepy"].send(30)
    proc = start_worker("--grace", "0.3")  # default queues: every queue the app's tasks use
    wait_for(job, JobState.RUNNING)

    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - started < 5  # the 30 s sleep was abandoned, not waited for
    released = job.refresh()
    assert (released.state, released.attempts) == (JobState.AVAILABLE, 0)
    assert "released 1 unfinished job(s)" in (tmp_path / "worker.log").read_text()


def test_cancel_a_running_job(
    start_worker: StartWorker, producer: Conveyor, invoke: Invoke, db_url: str
) -> None:
    job = producer.tasks["sleepy"].send(30)
    proc = start_worker("--lease", "1")  # heartbeats (which carry cancel requests) every 1/3 s
    wait_for(job, JobState.RUNNING)

    requested = invoke("jobs", "cancel", str(job.id), url=db_url)
    assert requested.exit_code == 0, requested.output
    assert requested.stdout == (
        f"job {job.id} (sleepy) is running: cancellation requested "
        "(its worker cancels it at its next heartbeat)\n"
    )
    cancelled = wait_for(job, JobState.CANCELLED, timeout=10)
    assert cancelled.error == "cancelled while running"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_burst_exits_when_dry(start_worker: StartWorker, producer: Conveyor) -> None:
    jobs = producer.tasks["add"].send_many([(1, 2), (3, 4)])
    proc = start_worker("--burst", "--queues", "default", "--log-level", "warning")
    assert proc.wait(timeout=20) == 0
    assert [j.refresh().state for j in jobs] == [JobState.SUCCEEDED] * 2


def test_sigterm_exits_despite_a_stuck_thread(tmp_path: Path) -> None:
    """A non-daemon thread of the user's own would keep a stopped worker alive forever."""
    (tmp_path / "stuck_app.py").write_text(
        "import threading, time\n"
        "from tests.cli.cliapp import app\n"
        "threading.Thread(target=time.sleep, args=(3600,), name='user-thread').start()\n"
    )
    env = subprocess_env()
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    url = f"sqlite:///{tmp_path / 'stuck.db'}"
    with open(tmp_path / "worker.log", "wb") as log:
        proc = subprocess.Popen(
            conveyor_cmd("-d", url, "worker", "--app", "stuck_app:app"),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 20
        while b"started:" not in (tmp_path / "worker.log").read_bytes():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "did not finish" in (tmp_path / "worker.log").read_text()


def test_worker_metrics_and_json_logs(
    start_worker: StartWorker, producer: Conveyor, tmp_path: Path
) -> None:
    import urllib.request

    port = free_port()
    proc = start_worker("--queues", "default", "--metrics-port", str(port), "--log-format", "json")
    jobs = producer.tasks["add"].send_many([(i, i) for i in range(6)])
    bad = producer.tasks["always_fails"].send()
    for job in jobs:
        assert job.wait(timeout=20).state == JobState.SUCCEEDED
    wait_for(bad, JobState.FAILED, timeout=30)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'conveyor_worker_jobs_total{outcome="succeeded",task="add"} 6.0' in metrics
    assert 'conveyor_worker_jobs_total{outcome="failed",task="always_fails"} 1.0' in metrics
    assert "conveyor_worker_job_duration_seconds_bucket" in metrics
    assert "conveyor_worker_claim_seconds_count" in metrics
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    lines = [json.loads(ln) for ln in (tmp_path / "worker.log").read_text().splitlines()]
    done = [ln for ln in lines if ln.get("task") == "add" and ln.get("outcome") == "succeeded"]
    assert len(done) == 6
    assert {"job_id", "queue", "attempt", "duration_s", "worker", "time", "level"} <= set(done[0])
    failed = [ln for ln in lines if ln.get("outcome") == "failed"]
    assert failed and failed[-1]["level"] == "error" and failed[-1]["job_id"] == bad.id


def test_a_worker_started_on_a_newer_schema_exits_3(
    start_worker: StartWorker, producer: Conveyor, tmp_path: Path
) -> None:
    """The README's contract: code older than the schema exits with status 3 (deploy
    the new code), at start as when the schema changes under a running worker."""
    producer.migrate()
    version = producer.backend.latest_schema + 1
    producer.backend._count("schema_version_insert", {"version": version, "name": "future"})
    proc = start_worker("--burst", "--queues", "default")
    assert proc.wait(timeout=30) == 3
    log = (tmp_path / "worker.log").read_text()
    assert f"schema version {version}" in log and "Traceback" not in log


@pytest.mark.own_database  # MariaDB refused the column's rename, now and then, in a reused one
def test_a_burst_worker_whose_claims_fail_exits_1(
    start_worker: StartWorker, producer: Conveyor, tmp_path: Path
) -> None:
    """A schema the code does not match (a column gone) fails every claim: a burst
    worker says so and exits non-zero instead of retrying for ever with its work
    undone (a worker that is not bursting retries, as through an outage)."""
    job = producer.tasks["add"].send(1, 2)
    with producer.backend._tx() as cur:
        cur.execute("ALTER TABLE conveyor_jobs RENAME COLUMN priority TO priority_gone")
    proc = start_worker("--burst", "--queues", "default")
    assert proc.wait(timeout=30) == 1
    log = (tmp_path / "worker.log").read_text()
    assert "could not claim jobs, stopping" in log and "priority" in log
    assert "Traceback" not in log
    with producer.backend._tx() as cur:
        cur.execute("ALTER TABLE conveyor_jobs RENAME COLUMN priority_gone TO priority")
    # not run (on MySQL the claim's UPDATE took it before its read failed: running,
    # until the dead worker's jobs are taken back)
    assert job.refresh().state in (JobState.AVAILABLE, JobState.RUNNING)


def test_a_worker_of_an_app_with_no_tasks_says_so(db_url: str, tmp_path: Path) -> None:
    """`--app` naming a module that registers no task starts a worker that can run
    none of the user's jobs: it warns, once, at start."""
    (tmp_path / "notasks.py").write_text("from conveyor import Conveyor\napp = Conveyor()\n")
    env = {
        **subprocess_env(),
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{subprocess_env()['PYTHONPATH']}",
    }
    out = subprocess.run(
        conveyor_cmd("-d", db_url, "worker", "--app", "notasks:app", "--burst"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("--app notasks:app registers no tasks (@app.task)") == 1, out.stderr
