"""Conveyor as Django's task backend, in a real project, against a real worker process."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from django.core import checks
from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.test.utils import override_settings
from django.utils import timezone
from shop import tasks
from shop.models import Event, Order

from conftest import DB, WorkerProcess, wait_until
from conveyor import JobNotFound

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


def finished(result_id: str, timeout: float = 30):
    def check():
        result = default_task_backend.get_result(result_id)
        return result if result.is_finished else None

    return wait_until(check, timeout, f"task result {result_id} to finish")


def events(kind: str, result_id: str) -> list[Event]:
    return list(Event.objects.filter(kind=kind, result_id=result_id).order_by("id"))


def test_migrate_made_conveyor_schema() -> None:
    version, latest = default_task_backend.app.schema_version()
    assert version == latest > 0


def test_enqueue_in_a_committed_atomic_block_runs(worker: WorkerProcess) -> None:
    app = default_task_backend.app
    with transaction.atomic():
        order = Order.objects.create(email="ada@example.com")
        result = tasks.send_receipt.enqueue(order.pk)
        assert result.status == READY
        # written through Django's connection: no other connection sees it yet
        with pytest.raises(JobNotFound):
            app.get_job(int(result.id))
    done = finished(result.id)
    assert done.status == SUCCESSFUL
    assert done.return_value == "sent to ada@example.com"
    assert [e.status for e in events("enqueued", result.id)] == [READY]


def test_enqueue_in_a_rolled_back_atomic_block_leaves_nothing(worker: WorkerProcess) -> None:
    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        raise Undo
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result.id)
    with pytest.raises(JobNotFound):
        default_task_backend.app.get_job(int(result.id))


def test_enqueue_outside_a_transaction_commits_at_once(worker: WorkerProcess) -> None:
    result = tasks.add.enqueue(2, 3)
    assert default_task_backend.app.get_job(int(result.id)).task == "shop.tasks.add"
    assert finished(result.id).return_value == 5


def test_a_retried_task_shows_every_failed_attempt(worker: WorkerProcess) -> None:
    result = tasks.flaky.enqueue(2)
    done = finished(result.id)
    assert done.status == SUCCESSFUL
    assert done.return_value == 3
    assert done.attempts == 3 and len(done.worker_ids) == 3
    assert [e.exception_class_path for e in done.errors] == ["shop.tasks.Flaky"] * 2
    assert "attempt 1 fails" in done.errors[0].traceback
    assert "attempt 2 fails" in done.errors[1].traceback
    assert done.errors[0].exception_class is tasks.Flaky
    assert [e.status for e in events("started", result.id)] == [RUNNING] * 3
    # one task_finished, once the task is finished: not after each failed attempt
    wait_until(lambda: events("finished", result.id), 10, "task_finished")
    [end] = events("finished", result.id)
    assert (end.status, end.detail) == (SUCCESSFUL, "attempts=3 errors=2")


def test_a_task_failing_every_attempt_is_failed(worker: WorkerProcess) -> None:
    result = tasks.flaky.enqueue(5)
    done = finished(result.id)
    assert done.status == FAILED
    assert len(done.errors) == 3 and done.attempts == 3
    with pytest.raises(ValueError, match="Task failed"):
        _ = done.return_value
    wait_until(lambda: events("finished", result.id), 10, "task_finished")
    assert [(e.status, e.detail) for e in events("finished", result.id)] == [
        (FAILED, "attempts=3 errors=3")
    ]


def test_async_task_and_async_api(worker: WorkerProcess) -> None:
    async def go():
        result = await tasks.async_add.aenqueue(20, 22)
        return await default_task_backend.aget_result(result.id)

    result = asyncio.run(go())
    assert result.status in (READY, RUNNING, SUCCESSFUL)
    assert finished(result.id).return_value == 42


def test_run_after_is_honoured(worker: WorkerProcess) -> None:
    when = timezone.now() + timedelta(seconds=2)
    result = tasks.record.using(run_after=when).enqueue("later")
    assert default_task_backend.get_result(result.id).status == READY
    done = finished(result.id)
    assert done.started_at >= when
    assert Event.objects.get(kind="ran", detail="later").at >= when


def test_priority_orders_the_queue_and_the_worker_command_takes_options() -> None:
    labels = {-100: "lowest", -5: "low", 0: "middle", 40: "high", 100: "highest"}
    ids = [
        tasks.record.using(queue_name="batch", priority=p).enqueue(labels[p]).id
        for p in (0, -100, 100, -5, 40)
    ]
    assert [default_task_backend.get_result(i).task.priority for i in ids] == [0, -100, 100, -5, 40]
    w = WorkerProcess("--queues", "batch", "--concurrency", "1", "--burst")
    assert w.wait(60) == 0, w.output()
    ran = [e.detail for e in Event.objects.filter(kind="ran", detail__in=labels.values())]
    assert ran == ["highest", "high", "middle", "low", "lowest"]


def test_worker_with_processes_runs_django_tasks_in_children() -> None:
    plain = tasks.add.using(queue_name="batch").enqueue(4, 5)
    context = tasks.flaky.using(queue_name="batch").enqueue(0)
    w = WorkerProcess("--queues", "batch", "--processes", "1", "--burst")
    assert w.wait(90) == 0, w.output()
    for result_id, value in ((plain.id, 9), (context.id, 1)):
        done = finished(result_id, 5)
        assert done.status == SUCCESSFUL, [e.traceback for e in done.errors]
        assert done.return_value == value
    assert [e.status for e in events("started", context.id)] == [RUNNING]


def test_a_killed_worker_s_task_runs_again(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    result = tasks.slow_first.enqueue(str(marker))
    first = WorkerProcess("--queues", "slow")
    wait_until(marker.exists, 30, "the first attempt to start")
    assert default_task_backend.get_result(result.id).status == RUNNING
    first.kill()  # SIGKILL, mid-task
    second = WorkerProcess("--queues", "slow")
    try:
        done = finished(result.id, 60)
    finally:
        assert second.stop() == 0, second.output()
    assert done.status == SUCCESSFUL and done.return_value == 2
    assert len(done.worker_ids) == 2 and done.worker_ids[0] != done.worker_ids[1]
    assert str(first.proc.pid) in done.worker_ids[0]


def test_periodic_tasks_from_settings_and_decorator_run() -> None:
    w = WorkerProcess("--queues", "cron")
    try:
        wait_until(
            lambda: (
                {"report", "heartbeat"}
                <= set(Event.objects.filter(kind="tick").values_list("detail", flat=True))
            ),
            30,
            "both schedules to tick",
        )
    finally:
        assert w.stop() == 0, w.output()


def test_task_options_reach_the_job() -> None:
    order = Order.objects.create(email="bob@example.com")
    result = tasks.send_receipt.using(queue_name="batch").enqueue(order.pk)
    job = default_task_backend.app.get_job(int(result.id))
    assert (job.queue, job.max_attempts, job.timeout) == ("batch", 2, 30.0)
    assert job.unique_key == f"receipt-{order.pk}"
    assert job.concurrency_key == f"order_id={order.pk}"
    handler = default_task_backend.app.tasks["shop.tasks.send_receipt"]  # what workers run
    assert (handler.defaults.backoff.base, handler.defaults.backoff.cap) == (0.1, 0.1)
    again = tasks.send_receipt.using(queue_name="batch").enqueue(order.pk)
    assert again.id == result.id  # one receipt per order while it waits
    keyed = tasks.add.using(queue_name="batch", unique_key="only-one").enqueue(1, 1)
    assert default_task_backend.app.get_job(int(keyed.id)).unique_key == "only-one"


def test_validate_task_refuses_what_conveyor_cannot_run() -> None:
    with pytest.raises(InvalidTask, match="max_attempts"):
        tasks.task(max_attempts=0)(tasks.add.func)
    with pytest.raises(InvalidTask, match="Queue 'nowhere'"):
        tasks.add.using(queue_name="nowhere")
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=101)
    with pytest.raises(TypeError, match="unknown option"):
        tasks.add.using(max_attempts=3)
    assert tasks.task(queue="emails")(tasks.add.func).queue_name == "emails"
    assert default_task_backend.app.tasks["shop.tasks.add"].defaults.queue == "emails"
    tasks.add.using()  # the module's declaration again
    assert default_task_backend.app.tasks["shop.tasks.add"].defaults.queue == "default"


def test_unknown_result_ids() -> None:
    for result_id in ("999999999", "abc", "-1", "", "1" * 40):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)
    # a job of a plain Conveyor task is not a Django task's result
    job = default_task_backend.app.enqueue("not.a.django.task", queue="batch")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(job.id))


def test_system_checks_name_the_misconfiguration() -> None:
    bad = {
        "default": {
            "BACKEND": "conveyor.contrib.django.ConveyorBackend",
            "OPTIONS": {
                "DATABASE": "missing",
                "COLOUR": "blue",
                "PERIODIC": {"x": {"task": "shop.tasks.report", "cron": "every day"}},
            },
        }
    }
    with override_settings(TASKS=bad):
        found = {m.id: m.msg for m in checks.run_checks() if m.id.startswith("conveyor.")}
    assert "conveyor.E001" in found and "COLOUR" in found["conveyor.E001"]
    assert "conveyor.E003" in found and "missing" in found["conveyor.E003"]
    assert "conveyor.E006" in found and "'x'" in found["conveyor.E006"]
    url = {
        "default": {
            "BACKEND": "conveyor.contrib.django.ConveyorBackend",
            "OPTIONS": {"URL": "redis://x"},
        }
    }
    with override_settings(TASKS=url):
        assert [m.id for m in checks.run_checks() if m.id.startswith("conveyor.")] == [
            "conveyor.E004"
        ]
    assert [m.id for m in checks.run_checks() if m.id.startswith("conveyor.")] == []


@pytest.mark.skipif(DB != "sqlite", reason="a SQLite setting")
def test_sqlite_without_immediate_transactions_is_warned() -> None:
    from django.db import connections

    options = connections["default"].settings_dict["OPTIONS"]
    connections["default"].settings_dict["OPTIONS"] = {}
    try:
        messages = list(default_task_backend.check())
    finally:
        connections["default"].settings_dict["OPTIONS"] = options
    assert [m.id for m in messages] == ["conveyor.W002"]
