"""Hooks, the task resolver and the async façade: what plugs into enqueue and
execution without touching the worker."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import textwrap
import time

import pytest

from conveyor import Conveyor, JobFailed, Middleware, current_job
from conveyor.records import JobState, Outcome
from conveyor.runtime.resolver import ImportPathTasks
from conveyor.runtime.worker import Worker

from .helpers import Running, finished, wait_for

tenant_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


class Recorder(Middleware):
    """Every hook, recorded; execute sets a context variable the handler reads."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_enqueue(self, jobs):
        self.events.append(("enqueue", [j.task for j in jobs]))
        return [j._replace(priority=j.priority + 1) for j in jobs]  # may change them

    def on_enqueued(self, jobs):
        self.events.append(("enqueued", [j.id for j in jobs]))

    async def execute(self, job, call_next):
        self.events.append(("before", job.id))
        token = tenant_var.set(f"tenant-of-{job.id}")
        try:
            return await call_next()
        finally:
            tenant_var.reset(token)
            self.events.append(("after", job.id))

    def on_outcome(self, job, outcome, duration_s):
        self.events.append(("outcome", job.id, str(outcome.outcome), duration_s is not None))

    def on_written(self, outcome, accepted):
        self.events.append(("written", outcome.job_id, accepted))


def test_middleware_wraps_enqueue_and_execution_of_sync_and_async_handlers(db_url):
    rec = Recorder()
    app = Conveyor(db_url, middleware=[rec])

    @app.task
    def sync_one():
        return tenant_var.get()  # set by the middleware, seen on the handler's thread

    @app.task
    async def async_one():
        return tenant_var.get()

    a, b = sync_one.send(), async_one.send()
    assert app.get_job(a.id).priority == 1  # on_enqueue changed it
    with Running(app):
        wait_for(finished(app, a.id, b.id))
        wait_for(lambda: sum(e[0] == "written" for e in rec.events) == 2)
    assert app.get_job(a.id).result == f"tenant-of-{a.id}"
    assert app.get_job(b.id).result == f"tenant-of-{b.id}"
    for job in (a, b):
        kinds = [e[0] for e in rec.events if e[0] != "enqueue" and e[1] == job.id]
        assert kinds == ["before", "after", "outcome", "written"]
        assert ("outcome", job.id, Outcome.SUCCEEDED, True) in rec.events
        assert ("written", job.id, True) in rec.events
    app.close()


def test_import_path_resolver_runs_tasks_the_app_never_registered(db_url, tmp_path, monkeypatch):
    (tmp_path / "elsewhere.py").write_text(
        textwrap.dedent(
            """
            def shout(text):
                return text.upper()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    producer = Conveyor(db_url)
    job = producer.enqueue("elsewhere:shout", ["hi"])
    missing = producer.enqueue("elsewhere:nothing_here", [], max_attempts=1)
    app = Conveyor(db_url)  # registers no task at all
    with Running(app, task_resolver=ImportPathTasks(app)):
        wait_for(finished(app, job.id, missing.id))
    assert app.get_job(job.id).result == "HI"
    got = app.get_job(missing.id)
    assert (
        got.state == JobState.FAILED and "no handler for task 'elsewhere:nothing_here'" in got.error
    )
    sys.modules.pop("elsewhere", None)
    producer.close()
    app.close()


def test_a_worker_with_no_resolver_claims_nothing_but_runs_the_services(db_url):
    app = Conveyor(db_url)

    @app.task
    def item(i):
        return i

    batch = item.batch([(1,)])
    with Running(app, resolver="none"):
        time.sleep(0.5)
        assert batch.jobs()[0].state == JobState.AVAILABLE  # not claimed
        second = Conveyor(db_url)
        # registered before the worker starts: a worker claims only the tasks it
        # has handlers for when it starts (registering after raced with that)
        second.task(name="item")(lambda i: i)
        with Running(second, queues=["default"]):
            # the first worker (leader or not) and the second close the batch together
            assert batch.wait(timeout=20).state == "succeeded"
        second.close()
    app.close()


def test_await_result_never_blocks_the_event_loop(app):
    @app.task
    async def slow_double(x):
        await asyncio.sleep(0.3)
        return 2 * x

    @app.task(max_attempts=1)
    def broken():
        raise ValueError("nope")

    async def scenario() -> tuple[int, int, str]:
        job = await slow_double.asend(21)
        bad = await app.aenqueue("broken")
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        result = await job.await_result(timeout=20)
        with pytest.raises(JobFailed, match="ValueError: nope"):
            await app.await_result(bad.id, timeout=20)
        t.cancel()
        return result, ticks, (await app.aget_job(job.id)).state

    with Running(app):
        result, ticks, state = asyncio.run(scenario())
    assert (result, state) == (42, JobState.SUCCEEDED)
    assert ticks > 10  # the loop kept running while we waited


def test_current_job_inside_a_handler(app):
    @app.task
    def who():
        job = current_job()
        return [job.id, job.task, job.attempts]

    job = who.send()
    worker = Worker(app, queues=["default"], burst=True, poll_s=0.05)
    worker.run(install_signals=False)
    assert app.get_job(job.id).result == [job.id, "who", 1]
