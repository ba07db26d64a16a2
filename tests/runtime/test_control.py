"""Cancel, stop, pause, snooze and priority aging with a real worker, on both backends."""

from __future__ import annotations

import asyncio
import threading
import time

from conveyor import Conveyor, Snooze, cancel_requested, current_job

from .helpers import Running, finished, wait_for


def test_cancelling_a_running_async_job(app):
    started, interrupted = threading.Event(), threading.Event()

    @app.task
    async def long():
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            interrupted.set()
            raise

    job = long.send()
    with Running(app, heartbeat_s=0.2, lease_s=5):
        assert started.wait(10)
        assert app.cancel_job(job.id) == "requested"
        wait_for(finished(app, job.id), what="job cancelled")
    got = app.get_job(job.id)
    assert (got.state, got.error) == ("cancelled", "cancelled while running")
    assert interrupted.is_set()
    assert [a.outcome for a in got.attempt_log()] == ["cancelled"]
    assert app.cancel_job(job.id) is None


def test_cancelling_a_running_sync_job_raises_its_flag(app):
    started, saw_flag = threading.Event(), threading.Event()

    @app.task
    def crunch():
        started.set()
        for _ in range(600):
            if cancel_requested():
                saw_flag.set()
                return "stopped early"
            time.sleep(0.05)
        return "done"

    job = crunch.send()
    with Running(app, heartbeat_s=0.2, lease_s=5):
        assert started.wait(10)
        app.cancel_job(job.id)
        wait_for(finished(app, job.id), what="job cancelled")
        assert saw_flag.wait(10)
    assert app.get_job(job.id).state == "cancelled"


def test_remote_stop_drains_the_worker(app):
    @app.task
    def noop():
        return 1

    with Running(app, heartbeat_s=0.2, lease_s=5) as running:
        wait_for(lambda: app.backend.worker_list(), what="worker registered")
        assert app.stop_worker(running.worker.id) is True
        running.thread.join(15)
        assert not running.thread.is_alive(), "worker did not stop on request"
    assert app.backend.worker_list() == []


def test_paused_queue_waits_for_resume(app):
    @app.task(queue="mail")
    def deliver():
        return "sent"

    app.pause_queue("mail")
    job = deliver.send()
    with Running(app, queues=["mail"], poll_s=0.1):
        time.sleep(1.0)
        assert app.get_job(job.id).state == "available"
        assert [q.paused for q in app.queues() if q.name == "mail"] == [True]
        app.resume_queue("mail")
        wait_for(finished(app, job.id), what="job run after resume")
    assert app.get_job(job.id).state == "succeeded"


def test_snooze_runs_again_later_without_using_attempts(app):
    calls = []

    @app.task(max_attempts=1)
    def patient():
        calls.append(current_job().attempts)
        if len(calls) < 3:
            return Snooze(0.1)
        return "ready"

    job = patient.send()
    with Running(app):
        wait_for(finished(app, job.id), what="job finished after snoozing")
    got = app.get_job(job.id)
    assert (got.state, got.result, got.attempts) == ("succeeded", "ready", 1)
    assert calls == [1, 1, 1]  # max_attempts=1, yet it ran three times
    assert [a.outcome for a in got.attempt_log()] == ["snoozed", "snoozed", "succeeded"]


def _low_job_start_delay(db_url, aging_s, limit_s, depth):
    """Seconds from the worker's first job until a priority-0 job (sent before
    the worker started) starts while priority-3 jobs keep the worker busy (about
    ``depth`` always waiting); None if not within limit_s. Counted from the
    worker's first job, not from its start, which a loaded machine delays."""
    app = Conveyor(db_url, priority_aging_s=aging_s)
    started: dict[str, float] = {}

    @app.task
    async def work(kind):
        started.setdefault(kind, time.monotonic())
        await asyncio.sleep(0.02)

    stop = threading.Event()

    def urgent_stream():
        while not stop.is_set():
            waiting = sum(c.count for c in app.counts() if c.state == "available")
            if waiting < depth:
                work.send_many([("urgent",)] * (depth + 2 - waiting), priority=3)
            time.sleep(0.02)

    producer = threading.Thread(target=urgent_stream, daemon=True)
    producer.start()
    time.sleep(0.3)
    work.send("low", priority=0)
    try:
        with Running(app, concurrency=2, fetch_batch=2, maintenance_s=0.1):
            try:
                wait_for(lambda: "low" in started, timeout=limit_s)
            except AssertionError:
                return None
            return started["low"] - started["urgent"]
    finally:
        stop.set()
        producer.join()
        app.close()


def test_aging_lets_a_low_priority_job_through_a_stream_of_urgent_ones(db_url):
    """A job of priority p ranks like a priority-P job enqueued (P - p) * aging_s
    later. Here priority-P jobs wait ~0.1 s, so from the worker's first job the
    bound is 3 * 0.5 s plus that wait, a maintenance pass and a claim: 2 s of slack
    (a slow 2-core machine took 2.96 s on MariaDB, counting the worker's start).
    Without aging the job never starts while urgent work is waiting (the control
    run, which keeps 300 urgent jobs waiting, seconds of work: a producer stalled
    by a loaded machine must not let the stream run dry)."""
    bound = 3 * 0.5 + 2.0
    waited = _low_job_start_delay(db_url, aging_s=0.5, limit_s=15, depth=10)
    assert waited is not None and waited <= bound, f"waited {waited}s, bound {bound}s"
    assert _low_job_start_delay(db_url, aging_s=None, limit_s=2 * bound, depth=300) is None


def test_send_distinct_runs_on_n_different_workers(app):
    from conveyor.runtime.context import current_job

    ran_by: list[str] = []

    @app.task
    def check(x):
        ran_by.append(current_job().lease_owner)
        return x

    batch = check.send_distinct(2, "ping")
    assert batch.total == 2
    with Running(app, worker_id="alpha"), Running(app, worker_id="beta"):
        assert batch.wait(timeout=20).state == "succeeded"
    assert sorted(ran_by) == ["alpha", "beta"]


def test_pinned_job_waits_for_a_worker_with_its_tag(app):
    @app.task(pinned_to="gpu")
    def render():
        return current_job().lease_owner

    job = render.send()
    with Running(app, worker_id="plain"):
        time.sleep(0.8)
        assert app.get_job(job.id).state == "available"
        with Running(app, worker_id="big-box", tags=["gpu"]):
            wait_for(finished(app, job.id), what="the gpu worker ran it")
    assert app.get_job(job.id).result == "big-box"
