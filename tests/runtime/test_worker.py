"""The worker in-process, against real databases."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta

from conveyor import Permanent, current_job
from conveyor.runtime.worker import Worker

from .helpers import Running, finished, wait_for

FAST = {"base": 0.05, "factor": 2, "cap": 0.2, "jitter": 0}


def test_async_and_sync_handlers_store_results(app):
    @app.task
    async def add(a, b):
        await asyncio.sleep(0)
        return a + b

    @app.task
    def shout(s, suffix="!"):
        return s.upper() + suffix

    jobs = [add.send(1, 2), shout.send("hi", suffix="?")]
    jobs += add.send_many([(i, i) for i in range(20)])
    with Running(app, concurrency=4):
        wait_for(finished(app, *(j.id for j in jobs)))
    assert app.get_job(jobs[0].id).result == 3
    assert app.get_job(jobs[1].id).result == "HI?"
    assert [app.get_job(j.id).result for j in jobs[2:]] == [2 * i for i in range(20)]
    assert all(app.get_job(j.id).state == "succeeded" for j in jobs)


def test_transient_errors_retry_with_backoff_then_succeed(app):
    calls = []

    @app.task(max_attempts=4, backoff=FAST)
    def flaky():
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ConnectionError(f"try {len(calls)}")
        return "ok"

    job = flaky.send()
    with Running(app):
        wait_for(finished(app, job.id))
    got = app.get_job(job.id)
    assert (got.state, got.attempts, got.result) == ("succeeded", 3, "ok")
    log = got.attempt_log()
    assert [a.outcome for a in log] == ["retry", "retry", "succeeded"]
    assert log[0].error == "ConnectionError: try 1" and "ConnectionError" in log[0].traceback
    assert all(a.worker_id and a.duration_s is not None for a in log)
    # the gaps between attempts follow the backoff (0.05 s, then 0.1 s)
    assert calls[1] - calls[0] >= 0.05 and calls[2] - calls[1] >= 0.1


def test_last_attempt_failure_is_kept_as_dead_letter(app):
    @app.task(max_attempts=2, backoff=FAST)
    def broken():
        raise ValueError("always")

    job = broken.send()
    with Running(app):
        wait_for(finished(app, job.id))
    got = app.get_job(job.id)
    assert got.state == "failed" and got.attempts == 2
    assert "ValueError: always" in got.error and "no attempts left" in got.error


def test_permanent_and_unlisted_errors_fail_at_once(app):
    @app.task(max_attempts=5)
    def refuse():
        raise Permanent("bad input")

    @app.task(max_attempts=5, retry_on=(TimeoutError,))
    def picky():
        raise KeyError("nope")

    a, b = refuse.send(), picky.send()
    with Running(app):
        wait_for(finished(app, a.id, b.id))
    got_a, got_b = app.get_job(a.id), app.get_job(b.id)
    assert (got_a.state, got_a.attempts) == ("failed", 1)
    assert "Permanent: bad input" in got_a.error and "not retried" in got_a.error
    assert (got_b.state, got_b.attempts) == ("failed", 1)
    assert "not in retry_on=(TimeoutError)" in got_b.error


def test_per_call_options_override_task_defaults(app):
    @app.task(max_attempts=5, priority=1)
    def boom():
        raise RuntimeError("x")

    job = boom.send(max_attempts=1, priority=9, backoff={"base": 0.01})
    assert (job.max_attempts, job.priority) == (1, 9)
    with Running(app):
        wait_for(finished(app, job.id))
    assert app.get_job(job.id).attempts == 1


def test_async_timeout_cancels_the_handler(app):
    cancelled = threading.Event()

    @app.task(timeout=0.2, max_attempts=1)
    async def slow():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job = slow.send()
    with Running(app):
        wait_for(finished(app, job.id))
    got = app.get_job(job.id)
    assert got.state == "failed" and "JobTimeout" in got.error and "0.2s timeout" in got.error
    assert cancelled.is_set()


def test_timeout_counts_execution_not_queue_wait(app):
    @app.task(timeout=0.5)
    async def quick():
        await asyncio.sleep(0.1)
        return "done"

    job = quick.send()
    time.sleep(1.0)  # waiting in the queue longer than the timeout is fine
    with Running(app):
        wait_for(finished(app, job.id))
    assert app.get_job(job.id).state == "succeeded"


def test_sync_timeout_late_result_is_refused_by_fencing(app):
    release = threading.Event()

    @app.task(timeout=0.2, max_attempts=1)
    def stuck():
        release.wait(10)
        return "too late"

    job = stuck.send()
    with Running(app) as running:
        wait_for(finished(app, job.id))
        assert app.get_job(job.id).state == "failed"
        release.set()  # the handler now returns its (late) result
        wait_for(lambda: running.worker.stats.counts["refused"] >= 1, what="late result refused")
    got = app.get_job(job.id)
    assert got.state == "failed" and got.result is None and "JobTimeout" in got.error
    assert [a.outcome for a in got.attempt_log()] == ["failed"]


def test_a_job_no_worker_can_run_waits_visibly_instead_of_failing(app, db_url):
    from conveyor import Conveyor

    producer = Conveyor(db_url)
    ghost_job = producer.enqueue("not_here")  # another app's task: no handler here

    @app.task
    def present():
        return 1

    ok = present.send()
    with Running(app):
        wait_for(finished(app, ok.id))
        time.sleep(0.3)  # several claim rounds
        assert app.get_job(ghost_job.id).state == "available"  # not claimed, not failed
        unserved = [(c.queue, c.task, c.count) for c in app.unserved()]
        assert unserved == [("default", "not_here", 1)]
    assert app.get_job(ghost_job.id).attempts == 0
    producer.close()


def test_result_that_is_not_json_fails_clearly(app):
    @app.task
    def weird():
        return object()

    job = weird.send()
    with Running(app):
        wait_for(finished(app, job.id))
    got = app.get_job(job.id)
    assert got.state == "failed" and "cannot be stored as JSON" in got.error


def test_handler_sees_its_job(app):
    @app.task
    async def who():
        job = current_job()
        return [job.id, job.attempts]

    @app.task
    def who_sync():
        return current_job().id

    a, b = who.send(), who_sync.send()
    with Running(app):
        wait_for(finished(app, a.id, b.id))
    assert app.get_job(a.id).result == [a.id, 1]
    assert app.get_job(b.id).result == b.id


def test_stop_lets_running_jobs_finish_within_grace(app):
    started = threading.Event()

    @app.task
    async def steady():
        started.set()
        await asyncio.sleep(0.5)
        return "finished"

    job = steady.send()
    with Running(app, grace_s=10) as running:
        assert started.wait(10)
        stats = running.stop()
    assert app.get_job(job.id).state == "succeeded"
    assert stats.counts["succeeded"] == 1 and stats.counts["released"] == 0


def test_stop_past_grace_releases_without_using_an_attempt(app):
    started = threading.Event()

    @app.task
    async def endless():
        started.set()
        await asyncio.sleep(60)

    job = endless.send()
    with Running(app, grace_s=0.2) as running:
        assert started.wait(10)
        stats = running.stop()
    got = app.get_job(job.id)
    assert (got.state, got.attempts, got.lease_owner) == ("available", 0, None)
    assert stats.counts["released"] == 1


def test_worker_that_loses_a_lease_stops_that_job(app):
    started = threading.Event()
    cancelled = threading.Event()

    @app.task(max_attempts=3)
    async def long():
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job = long.send()
    with Running(app, lease_s=3, heartbeat_s=0.2, maintenance_s=60, grace_s=0.2) as running:
        assert started.wait(10)
        # the leader decides this worker is dead (time passed in): its job is rescued
        app.backend.job_rescue(worker_ttl_s=3, now=datetime.now(UTC) + timedelta(seconds=10))
        wait_for(cancelled.is_set, what="handler cancelled after its lease was lost")
        assert running.worker.stats.counts["lost"] == 1
        stats = running.stop()
    # the rescued job may have been claimed again (attempt 2) and released at stop
    got = app.get_job(job.id)
    assert got.state == "available" and got.attempts == 1
    assert next(a.outcome for a in got.attempt_log()) == "lost"
    assert {a.outcome for a in got.attempt_log()} <= {"lost", "released"}
    assert stats.counts["succeeded"] == 0


def test_expired_lease_is_rescued_by_a_running_worker(app):
    @app.task
    def simple():
        return "ok"

    job = simple.send()
    # a worker that died right after claiming: it never heartbeats again
    [claimed] = app.backend.job_claim(queues=["default"], worker_id="dead", limit=1)
    assert claimed.id == job.id
    with Running(app, maintenance_s=0.2):
        wait_for(finished(app, job.id))
    got = app.get_job(job.id)
    assert (got.state, got.attempts) == ("succeeded", 2)
    assert [a.outcome for a in got.attempt_log()] == ["lost", "succeeded"]


def test_delayed_job_waits_then_runs(app):
    @app.task
    def later():
        return datetime.now(UTC).isoformat()

    job = later.send(delay=0.6)
    assert job.state == "scheduled"
    with Running(app):
        wait_for(finished(app, job.id))
    ran_at = datetime.fromisoformat(app.get_job(job.id).result)
    assert ran_at >= job.created_at + timedelta(seconds=0.5)


def _claimer(app, **options):
    """A worker as run_async sets it up for claiming, without running it."""
    worker = Worker(app, queues=["default"], **options)
    worker.backend, worker._schema, worker._tasks = app.backend, app.backend.latest_schema, None
    return worker


def test_a_hint_wakes_the_fetch_thread_and_it_claims_at_once(app):
    @app.task
    def noop() -> None: ...

    job = noop.send()
    worker = _claimer(app)
    worker._hinted()  # as the listener thread does on NOTIFY (or a changed SQLite file)
    began = time.monotonic()
    claimed = worker._claim_when_woken(
        wait=30, left=threading.Event(), queues=["default"], limit=10
    )
    assert claimed is not None and time.monotonic() - began < 10
    assert [j.id for j in claimed[0]] == [job.id]
    assert not worker._wake.is_set()  # the hint was for this claim; the next one waits


def test_a_claim_after_a_wait_asks_for_the_slots_free_by_then(app):
    """The claim loop counts free slots before the fetch thread waits; under a
    queue limit the wait is for this worker's own outcomes, whose jobs held slots
    when they were counted. A claim for the old count filled the limit, looked full,
    and the next claim, made at once, found nothing (a third of the claims of a
    drain under max_running=50). The fetch thread counts again after the wait."""

    @app.task
    def noop() -> None: ...

    noop.send_many([() for _ in range(12)])
    worker = _claimer(app, concurrency=10)
    # The loop counted 2 free slots of 10; meanwhile 6 of the 8 jobs it ran finished
    # and their outcomes were written (which wakes the fetch thread): 2 still run.
    worker.running = {-1: None, -2: None}  # type: ignore[dict-item]
    worker._hinted()
    claimed = worker._claim_when_woken(wait=30, left=threading.Event(), queues=["default"], limit=2)
    assert claimed is not None
    jobs, _, asked = claimed
    assert (len(jobs), asked) == (8, 8)  # the 8 slots free now, not the 2 counted before
    # claimed at once (no wait): the count the loop made stands
    claimed = worker._claim_when_woken(
        wait=None, left=threading.Event(), queues=["default"], limit=1
    )
    assert claimed is not None and (len(claimed[0]), claimed[2]) == (1, 1)


def test_a_fetch_thread_whose_loop_left_or_that_is_stopping_claims_nothing(app):
    """The fetch thread waits for work itself; woken after the claim loop was
    cancelled (it set `left`) or the worker began to stop, it must not claim: the jobs
    would stay leased to a worker that never runs them."""

    @app.task
    def noop() -> None: ...

    job = noop.send()
    worker = _claimer(app)
    left = threading.Event()
    left.set()
    worker._hinted()
    assert worker._claim_when_woken(wait=30, left=left, queues=["default"], limit=10) is None
    worker._stopping = True
    assert (
        worker._claim_when_woken(wait=None, left=threading.Event(), queues=["default"], limit=10)
        is None
    )
    assert app.get_job(job.id).state == "available"
