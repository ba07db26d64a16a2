"""migrate, enqueue, jobs and status against real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from conveyor import Conveyor, JobState
from conveyor.records import WorkerInfo
from conveyor.runtime.worker import Worker

from . import cliapp
from .conftest import TEST_APP, Invoke


def test_migrate_then_up_to_date(invoke: Invoke, db_url: str) -> None:
    first = invoke("migrate", url=db_url)
    assert first.exit_code == 0, first.output
    assert first.stdout.startswith("applied migration(s) 1")
    again = invoke("migrate", url=db_url)
    assert again.exit_code == 0
    with Conveyor(db_url) as app:
        latest = app.backend.latest_schema
    assert again.stdout.strip() == f"schema up to date (version {latest})"


def test_enqueue_prints_the_id_and_applies_options(
    invoke: Invoke, db_url: str, app: Conveyor
) -> None:
    args = [
        "enqueue",
        "add",
        "--app",
        TEST_APP,
        "--args",
        "[1, 2]",
        "--queue",
        "q",
        "--priority",
        "5",
        "--delay",
        "60",
        "--max-attempts",
        "2",
        "--unique-key",
        "k1",
    ]
    result = invoke(*args, url=db_url)
    assert result.exit_code == 0, result.output
    job = app.get_job(int(result.stdout))
    assert (job.task, job.args, job.queue, job.priority, job.max_attempts, job.state) == (
        "add",
        [1, 2],
        "q",
        5,
        2,
        JobState.SCHEDULED,
    )
    # The unique key names the job already waiting: same id, nothing new.
    assert invoke(*args, url=db_url).stdout == result.stdout


def test_enqueue_kwargs(invoke: Invoke, db_url: str, app: Conveyor) -> None:
    result = invoke("enqueue", "add", "--app", TEST_APP, "--kwargs", '{"a": 1, "b": 2}', url=db_url)
    assert result.exit_code == 0, result.output
    job = app.get_job(int(result.stdout))
    assert job.kwargs == {"a": 1, "b": 2} and job.state == "available"


def test_app_url_is_used_without_d(
    invoke: Invoke, db_url: str, app: Conveyor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cliapp.app, "url", db_url)
    result = invoke("enqueue", "add", "--args", "[3, 4]", env={"CONVEYOR_APP": TEST_APP})
    assert result.exit_code == 0, result.output
    assert app.get_job(int(result.stdout)).args == [3, 4]


def test_enqueue_unknown_task_lists_tasks(invoke: Invoke, db_url: str) -> None:
    result = invoke("enqueue", "nope", "--app", TEST_APP, url=db_url)
    assert result.exit_code == 2
    assert "unknown task 'nope'" in result.stderr
    assert "add, always_fails, boom, sleepy, staged, summarise" in result.stderr


def test_enqueue_arguments_that_do_not_fit(invoke: Invoke, db_url: str) -> None:
    result = invoke("enqueue", "add", "--app", TEST_APP, "--args", "[1, 2, 3]", url=db_url)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: bad arguments for task 'add'")


def test_show_missing_job(invoke: Invoke, db_url: str) -> None:
    invoke("migrate", url=db_url)
    result = invoke("jobs", "show", "12345", url=db_url)
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: no job with id 12345"


@pytest.fixture
def finished(app: Conveyor) -> dict[str, int]:
    """A failed job with two attempts, a permanently failed one, a succeeded one."""
    cliapp.register(app)
    ids = {
        "failed": app.tasks["always_fails"].send().id,
        "permanent": app.tasks["boom"].send().id,
        "succeeded": app.tasks["add"].send(2, 3).id,
    }
    Worker(app, queues="default", concurrency=2, burst=True, poll_s=0.05).run(install_signals=False)
    return ids


def test_jobs_list_and_show(invoke: Invoke, db_url: str, finished: dict[str, int]) -> None:
    listed = invoke("jobs", "list", "--state", "failed", url=db_url)
    assert listed.exit_code == 0, listed.output
    assert "always_fails" in listed.stdout and "boom" in listed.stdout
    assert "RuntimeError: still broken" in listed.stdout
    assert "add" not in listed.stdout.replace("always_fails", "")

    as_json = json.loads(invoke("jobs", "list", "--json", url=db_url).stdout)
    assert {j["id"] for j in as_json} == set(finished.values())
    assert all("lease_token" not in j for j in as_json)

    shown = invoke("jobs", "show", str(finished["failed"]), url=db_url)
    assert shown.exit_code == 0, shown.output
    for text in (
        "always_fails",
        "failed",
        "2 of 2",
        "attempts",
        "retry",
        "last traceback",
        "RuntimeError: still broken",
    ):
        assert text in shown.stdout

    succeeded = invoke("jobs", "show", str(finished["succeeded"]), url=db_url).stdout
    assert "succeeded" in succeeded and "lease" not in succeeded  # no lease once finished

    detail = json.loads(
        invoke("jobs", "show", str(finished["succeeded"]), "--json", url=db_url).stdout
    )
    assert detail["result"] == 5 and detail["state"] == "succeeded"
    assert [a["outcome"] for a in detail["attempts"]] == ["succeeded"]


def test_jobs_show_names_the_lease_only_while_running(
    invoke: Invoke, db_url: str, app: Conveyor
) -> None:
    cliapp.register(app)
    job_id = app.tasks["add"].send(1, 2).id
    (claimed,) = app.serving.claim("remote-1", ["default"], limit=1, lease_s=60)
    assert claimed.id == job_id
    shown = invoke("jobs", "show", str(job_id), url=db_url).stdout
    assert "lease owner" in shown and "remote-1" in shown and "lease expires" in shown


def test_jobs_list_filters(invoke: Invoke, db_url: str, finished: dict[str, int]) -> None:
    rows = json.loads(invoke("jobs", "list", "--task", "add", "--json", url=db_url).stdout)
    assert [r["id"] for r in rows] == [finished["succeeded"]]
    empty = invoke("jobs", "list", "--queue", "nowhere", url=db_url)
    assert empty.stdout.strip() == "no jobs match"


def test_retry_and_cancel(
    invoke: Invoke, db_url: str, finished: dict[str, int], app: Conveyor
) -> None:
    job_id = str(finished["failed"])
    retried = invoke("jobs", "retry", job_id, url=db_url)
    assert retried.exit_code == 0, retried.output
    assert app.get_job(int(job_id)).state == "available"

    again = invoke("jobs", "retry", job_id, url=db_url)
    assert again.exit_code == 1
    assert "is available: only failed or cancelled jobs can be retried" in again.stderr

    assert invoke("jobs", "cancel", job_id, url=db_url).exit_code == 0
    assert app.get_job(int(job_id)).state == "cancelled"
    refused = invoke("jobs", "cancel", str(finished["succeeded"]), url=db_url)
    assert refused.exit_code == 1
    assert refused.stderr == (
        f"error: job {finished['succeeded']} is succeeded: only unfinished jobs can be cancelled\n"
    )

    assert invoke("jobs", "retry", "999999", url=db_url).exit_code == 2


def test_status(invoke: Invoke, db_url: str, finished: dict[str, int], app: Conveyor) -> None:
    app.tasks["sleepy"].send(1, delay=60)
    table = invoke("status", url=db_url)
    assert table.exit_code == 0, table.output
    for text in (
        "queue",
        "scheduled",
        "succeeded",
        "default",
        "slow",
        "total",
        "no workers running",
    ):
        assert text in table.stdout

    data = json.loads(invoke("status", "--json", url=db_url).stdout)
    assert data["queues"]["default"] == {
        "scheduled": 0,
        "available": 0,
        "running": 0,
        "succeeded": 1,
        "failed": 2,
        "cancelled": 0,
    }
    assert data["queues"]["slow"]["scheduled"] == 1
    assert data["workers"] == []


def test_status_flags_silent_workers(invoke: Invoke, db_url: str, app: Conveyor) -> None:
    # A worker that last heartbeat five minutes ago (killed without deregistering).
    gone = WorkerInfo(id="host:1:dead", hostname="host", pid=1, queues=["default"], concurrency=3)
    five_min_ago = datetime.now(UTC) - timedelta(minutes=5)
    app.backend.worker_heartbeat(worker=gone, now=five_min_ago)
    table = invoke("status", url=db_url)
    assert "host:1:dead" in table.stdout
    assert "1 worker(s) silent for over 60s" in table.stdout
    (worker,) = json.loads(invoke("status", "--json", url=db_url).stdout)["workers"]
    assert worker["id"] == "host:1:dead" and worker["last_seen_s_ago"] > 290
