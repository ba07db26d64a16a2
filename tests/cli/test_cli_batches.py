"""`conveyor batches`, and what batches, stages and chains add to `jobs` and `status`,
against real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from conveyor import Conveyor
from conveyor.runtime.flow_service import FlowService
from conveyor.runtime.worker import Worker

from .conftest import Invoke, StartWorker, conveyor_cmd, subprocess_env


def settle(app: Conveyor, timeout: float = 20.0) -> None:
    """Run every job that may run now and close every batch that can close, in
    process: burst workers for the jobs (a burst leaves retries still to come to
    the next one), the flow service for the batches and chains (whose closing or
    advancing enqueues more jobs, which the next burst runs)."""
    flow = FlowService(app.backend)
    deadline = time.monotonic() + timeout
    while True:
        Worker(app, queues="default", concurrency=4, burst=True, poll_s=0.05).run(
            install_signals=False
        )
        closed, advanced = flow.step()
        due = app.list_jobs(state="available", limit=1) or [
            j
            for j in app.list_jobs(state="scheduled", limit=1000)
            if (j.scheduled_at - datetime.now(UTC)).total_seconds() < 5
        ]
        if not (closed or advanced or due):
            return
        assert time.monotonic() < deadline, "jobs or batches still moving"


def cells(line: str) -> list[str]:
    """The words of a table row, without the column separators."""
    return [word for word in line.split() if word not in ("│", "┃")]


@dataclass
class Batches:
    ok: int  # succeeded, with an on_complete
    broken: int  # completed_with_failures
    waiting: int  # running: its jobs wait 60 s before they may run


@pytest.fixture
def batches(producer: Conveyor) -> Batches:
    tasks = producer.tasks
    ok = tasks["add"].batch([(i, i) for i in range(3)], name="sums", on_complete=tasks["summarise"])
    broken = tasks["always_fails"].batch([(), ()], name="broken")
    waiting = tasks["add"].batch([(1, 1), (2, 2)], name="waiting", delay=60)
    settle(producer)
    assert producer.get_batch(ok.id).state == "succeeded"
    assert producer.get_batch(broken.id).state == "completed_with_failures"
    return Batches(ok.id, broken.id, waiting.id)


def test_batches_list(invoke: Invoke, db_url: str, batches: Batches) -> None:
    table = invoke("batches", "list", url=db_url)
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert all(name in lines[0] for name in ("id", "name", "task", "state", "pending", "created"))
    # Newest first, with the progress counts of each: total, succeeded, failed,
    # cancelled, running, pending
    rows = [cells(line) for line in lines[2:]]
    assert [r[0] for r in rows] == [str(b) for b in (batches.waiting, batches.broken, batches.ok)]
    assert rows[0][1:11] == ["waiting", "add", "running", "0%", "2", "0", "0", "0", "0", "2"]
    assert rows[1][1:10] == ["broken", "always_fails", "completed_with_failures", *"202000"]
    assert rows[2][1:10] == ["sums", "add", "succeeded", *"330000"]

    rows = json.loads(invoke("batches", "list", "--json", url=db_url).stdout)
    assert [r["id"] for r in rows] == [batches.waiting, batches.broken, batches.ok]
    assert rows[0]["progress"] == {
        "total": 2,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
        "running": 0,
        "pending": 2,
        "percent": 0,
        "eta_s": None,
    }
    assert rows[2]["final_counts"] == {"succeeded": 3} and rows[2]["on_complete"] == "summarise"

    running = json.loads(
        invoke("batches", "list", "--state", "running", "--json", url=db_url).stdout
    )
    assert [r["name"] for r in running] == ["waiting"]
    limited = json.loads(invoke("batches", "list", "-n", "1", "--json", url=db_url).stdout)
    assert [r["name"] for r in limited] == ["waiting"]
    none = invoke("batches", "list", "--state", "cancelled", url=db_url)
    assert none.exit_code == 0 and none.stdout.strip() == "no batches match"


def test_batches_show(invoke: Invoke, db_url: str, batches: Batches, app: Conveyor) -> None:
    shown = invoke("batches", "show", str(batches.ok), url=db_url)
    assert shown.exit_code == 0, shown.output
    for text in (
        "sums",
        "succeeded",
        "3 succeeded, 0 failed, 0 cancelled, 0 running, 0 pending",
        "3 of 3 (100%)",
        "final counts",
        "finished",
        "summarise(batch_id, counts): called 1 time(s)",
    ):
        assert text in shown.stdout, text

    waiting = invoke("batches", "show", str(batches.waiting), url=db_url)
    assert "0 of 2 (0%)" in waiting.stdout
    assert "unknown until a job finishes" in waiting.stdout  # the ETA
    assert "final counts" not in waiting.stdout

    data = json.loads(invoke("batches", "show", str(batches.broken), "--json", url=db_url).stdout)
    assert data["state"] == "completed_with_failures"
    assert (data["name"], data["task"], data["total"]) == ("broken", "always_fails", 2)
    assert data["final_counts"] == {"failed": 2}
    assert data["progress"]["failed"] == 2 and data["progress"]["percent"] == 100
    assert data["finished_at"] and data["on_complete"] is None

    # The on_complete job ran with the final counts.
    (callback,) = app.list_jobs(task="summarise")
    assert callback.result == f"batch {batches.ok}: [('succeeded', 3)]"


def test_missing_batch_is_one_error_line(invoke: Invoke, db_url: str) -> None:
    invoke("migrate", url=db_url)
    for command in (["show"], ["show", "--follow"], ["cancel"], ["retry-failed"]):
        result = invoke("batches", command[0], "4242", *command[1:], url=db_url)
        assert result.exit_code == 2, result.output
        assert result.stderr == "error: no batch with id 4242\n"


def test_batches_cancel(invoke: Invoke, db_url: str, batches: Batches, app: Conveyor) -> None:
    result = invoke("batches", "cancel", str(batches.waiting), url=db_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"batch {batches.waiting}: cancelled 2 pending job(s)")
    assert {j.state for j in app.get_batch(batches.waiting).jobs()} == {"cancelled"}
    settle(app)
    assert app.get_batch(batches.waiting).state == "cancelled"

    for batch_id in (batches.waiting, batches.ok):
        closed = invoke("batches", "cancel", str(batch_id), url=db_url)
        assert closed.exit_code == 1
        assert "is already closed" in closed.stderr and "nothing left to cancel" in closed.stderr


def test_batches_retry_failed(invoke: Invoke, db_url: str, batches: Batches, app: Conveyor) -> None:
    result = invoke("batches", "retry-failed", str(batches.broken), url=db_url)
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"batch {batches.broken}: retried 2 failed job(s); the batch is running again\n"
    )
    batch = app.get_batch(batches.broken)
    assert batch.state == "running"
    assert {j.state for j in batch.jobs()} == {"available"}

    for batch_id in (batches.broken, batches.ok):  # nothing failed (any more)
        none = invoke("batches", "retry-failed", str(batch_id), url=db_url)
        assert none.exit_code == 1
        assert none.stderr == f"error: batch {batch_id} has no failed jobs: nothing to retry\n"


def test_jobs_list_by_batch(invoke: Invoke, db_url: str, batches: Batches, app: Conveyor) -> None:
    rows = json.loads(
        invoke("jobs", "list", "--batch", str(batches.ok), "--json", url=db_url).stdout
    )
    ids = [j.id for j in app.get_batch(batches.ok).jobs()]
    assert [r["id"] for r in rows] == ids[::-1]  # newest first, like every list
    assert all(r["batch_id"] == batches.ok for r in rows)
    one = json.loads(
        invoke("jobs", "list", "--batch", str(batches.ok), "-n", "1", "--json", url=db_url).stdout
    )
    assert [r["id"] for r in one] == [ids[-1]]
    none = invoke("jobs", "list", "--batch", str(batches.ok), "--state", "failed", url=db_url)
    assert none.stdout.strip() == "no jobs match"
    missing = invoke("jobs", "list", "--batch", "4242", url=db_url)
    assert missing.exit_code == 2 and missing.stderr == "error: no batch with id 4242\n"

    shown = invoke("jobs", "show", str(ids[0]), url=db_url)
    assert any(line.split() == ["batch", str(batches.ok)] for line in shown.stdout.splitlines())


def test_jobs_show_stage_context_and_attempt_stages(
    invoke: Invoke, db_url: str, producer: Conveyor
) -> None:
    job = producer.tasks["staged"].send(4)
    settle(producer)
    assert job.refresh().result == 40

    shown = invoke("jobs", "show", str(job.id), url=db_url)
    assert shown.exit_code == 0, shown.output
    lines = [line.split() for line in shown.stdout.splitlines()]
    assert ["stage", "second"] in lines
    assert ["context", '{"n":', "4}"] in lines
    header = next(line for line in lines if line[:2] == ["attempt", "┃"])
    assert "stage" in header
    # attempt 1 ran the first stage (no name) and moved on; attempt 1 of "second" succeeded
    assert lines[lines.index(header) + 2][:4] == ["1", "│", "│", "stage"]
    assert lines[lines.index(header) + 3][:5] == ["1", "│", "second", "│", "succeeded"]

    data = json.loads(invoke("jobs", "show", str(job.id), "--json", url=db_url).stdout)
    assert (data["stage"], data["context"], data["batch_id"]) == ("second", {"n": 4}, None)
    assert [(a["stage"], a["outcome"]) for a in data["attempts"]] == [
        (None, "stage"),
        ("second", "succeeded"),
    ]


def test_jobs_show_chain_links(invoke: Invoke, db_url: str, producer: Conveyor) -> None:
    add = producer.tasks["add"]
    chain = producer.chain(add.s(1, 2), add.s(10), add.s(100))

    def show(job_id: int) -> list[list[str]]:
        result = invoke("jobs", "show", str(job_id), url=db_url)
        assert result.exit_code == 0, result.output
        return [line.split() for line in result.stdout.splitlines()]

    before = show(chain.id)
    assert ["chain", "starts", "with", "this", "job"] in before
    assert ["chain", "next", "enqueued", "once", "this", "job", "succeeds"] in before
    assert ["steps", "after", "add", "->", "add"] in before

    settle(producer)
    first, second, last = chain.jobs()
    assert last.result == 113
    assert ["chain", "next", "job", str(second.id)] in show(first.id)
    middle = show(second.id)
    assert ["chain", "started", "by", "job", str(first.id)] in middle
    assert ["steps", "after", "add"] in middle
    assert ["chain", "next", "none:", "this", "is", "the", "last", "step"] in show(last.id)


def test_status_shows_open_batches(invoke: Invoke, db_url: str, batches: Batches) -> None:
    table = invoke("status", url=db_url)
    assert table.exit_code == 0, table.output
    assert "open batches: 1" in table.stdout
    row = next(cells(line) for line in table.stdout.splitlines() if "waiting" in line)
    assert row == [str(batches.waiting), "waiting", "add", "0/2", "0%"]

    data = json.loads(invoke("status", "--json", url=db_url).stdout)["batches"]
    assert data["running"] == 1
    assert [(b["id"], b["name"], b["percent"]) for b in data["shown"]] == [
        (batches.waiting, "waiting", 0)
    ]


def test_status_without_batches_says_nothing_of_them(invoke: Invoke, db_url: str) -> None:
    invoke("migrate", url=db_url)
    table = invoke("status", url=db_url)
    assert table.exit_code == 0 and "batches" not in table.stdout
    assert json.loads(invoke("status", "--json", url=db_url).stdout)["batches"] == {
        "running": 0,
        "shown": [],
    }


# -- --follow ------------------------------------------------------------------------------
def test_follow_until_a_worker_closes_the_batch(
    start_worker: StartWorker, producer: Conveyor, db_url: str
) -> None:
    """Lines a second when stdout is a pipe; exit 0 with the final counts once closed."""
    batch = producer.tasks["sleepy"].batch(
        [(0.25,)] * 8, name="naps", on_complete=producer.tasks["summarise"]
    )
    follow = subprocess.Popen(
        conveyor_cmd("-d", db_url, "batches", "show", str(batch.id), "--follow"),
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        start_worker("--concurrency", "2")
        out, err = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, out + err
    lines = out.strip().splitlines()
    assert lines[0].startswith(f"batch {batch.id}: ") and "/8 done (" in lines[0]
    assert lines[-1] == f"batch {batch.id} (naps) closed: succeeded - 8 succeeded"
    assert producer.get_batch(batch.id).state == "succeeded"


@pytest.fixture
def worker_thread(producer: Conveyor) -> Iterator[Worker]:
    """A worker running in a thread of the test process (quick to start)."""
    worker = Worker(producer, queues=("default", "slow"), concurrency=4, poll_s=0.05)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    yield worker
    worker.stop(graceful=False)
    thread.join(10)


def test_follow_draws_a_bar_on_a_terminal(
    invoke: Invoke, db_url: str, producer: Conveyor, worker_thread: Worker
) -> None:
    # a name that is neither rich markup nor a format string, whatever it looks like
    batch = producer.tasks["sleepy"].batch([(0.2,)] * 6, name="[b]{0}")
    # rich takes these for a terminal: the live bar, not lines
    env = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "150"}
    result = invoke("batches", "show", str(batch.id), "--follow", url=db_url, env=env)
    assert result.exit_code == 0, result.output
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.stdout)  # colours, cursor moves
    assert "━" in out and f"batch {batch.id} ([b]{{0}})" in out
    assert "6/6" in out and "100%" in out
    assert out.endswith(f"batch {batch.id} ([b]{{0}}) closed: succeeded - 6 succeeded\n")


def test_follow_json_waits_then_prints_the_closed_batch(
    invoke: Invoke, db_url: str, producer: Conveyor, worker_thread: Worker
) -> None:
    batch = producer.tasks["always_fails"].batch([()] * 2, name="quiet")
    result = invoke("batches", "show", str(batch.id), "--follow", "--json", url=db_url)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # nothing but the JSON
    assert data["state"] == "completed_with_failures" and data["final_counts"] == {"failed": 2}


def test_follow_of_a_closed_batch_returns_at_once(
    invoke: Invoke, db_url: str, batches: Batches
) -> None:
    result = invoke("batches", "show", str(batches.ok), "--follow", url=db_url)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"batch {batches.ok} (sums) closed: succeeded - 3 succeeded\n"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_ctrl_c_stops_following_cleanly(producer: Conveyor, db_url: str) -> None:
    batch = producer.tasks["add"].batch([(1, 2)], name="never", delay=60)  # no worker: stays open
    follow = subprocess.Popen(
        conveyor_cmd("-d", db_url, "batches", "show", str(batch.id), "--follow"),
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()  # following has begun
        assert first.startswith(f"batch {batch.id}: 0/1 done (0%)"), first
        follow.send_signal(signal.SIGINT)
        out, err = follow.communicate(timeout=10)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, out + err
    assert err == f"stopped following batch {batch.id} (it goes on without you)\n"
    assert "Traceback" not in out + err
    assert producer.get_batch(batch.id).state == "running"
