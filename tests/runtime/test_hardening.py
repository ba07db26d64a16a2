"""Whatever a handler does, its job ends in a state a person can see and act on;
timeouts and cancellation mean what they say; a worker takes only what it can
run; operator actions keep every invariant (issue 8). Real workers in threads,
real databases."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from conveyor import Conveyor, Fail, NextStage, Permanent, Retry, cancel_requested, current_job
from conveyor.records import Finalize, JobState, Outcome
from conveyor.runtime.completer import Completer

from .helpers import Running, finished, wait_for


# -- 1. a job is never stuck running because its outcome could not be described --------------
class Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no string for you")


def test_an_exception_whose_str_raises_fails_the_job_and_the_worker_goes_on(app):
    @app.task(max_attempts=1)
    def hostile():
        raise Hostile()

    @app.task
    def fine():
        return 1

    bad, good = hostile.send(), fine.send()
    with Running(app):
        wait_for(finished(app, bad.id, good.id), what="both jobs finished")
    got = app.get_job(bad.id)
    assert got.state == JobState.FAILED
    assert "Hostile: <str() of the exception raised RuntimeError>" in got.error
    assert app.get_job(good.id).state == JobState.SUCCEEDED


def test_a_result_nested_too_deeply_to_encode_fails_the_job(app):
    @app.task
    def deep():
        value: list = []
        for _ in range(100_000):
            value = [value]
        return value

    job = deep.send()
    with Running(app):
        wait_for(finished(app, job.id))
    got = app.get_job(job.id)
    assert got.state == JobState.FAILED and "cannot be stored as JSON" in got.error


def test_a_classifier_that_raises_fails_the_attempt_with_what_could_be_said(app):
    def broken(exc, job):
        raise ZeroDivisionError("classifier bug")

    @app.task(classify=broken)
    def flaky():
        raise ValueError("boom")

    job = flaky.send()
    with Running(app):
        wait_for(finished(app, job.id))
    got = app.get_job(job.id)
    assert got.state == JobState.FAILED
    assert "could not be recorded as it was (ZeroDivisionError: classifier bug" in got.error


# -- 2. text databases cannot store, stored alike everywhere; one bad row holds back none -----
def test_nul_characters_in_results_and_errors_are_stored_as_replacement_characters(app):
    @app.task
    def nul_result():
        return {"text": "a\x00b", "key\x00": 1}

    @app.task(max_attempts=1)
    def nul_error():
        raise ValueError("bad\x00byte")

    ok, bad = nul_result.send(), nul_error.send()
    with Running(app):
        wait_for(finished(app, ok.id, bad.id))
    assert app.get_job(ok.id).result == {"text": "a\ufffdb", "key\ufffd": 1}
    got = app.get_job(bad.id)
    assert got.state == JobState.FAILED and "bad\ufffdbyte" in got.error


def test_a_row_the_database_refuses_is_isolated_and_the_others_are_written(app):
    @app.task
    def noop():
        return None

    jobs = noop.send_many([()] * 3)
    claimed = app.backend.job_claim(queues=["default"], worker_id="w1", limit=3)
    assert len(claimed) == 3
    good = [
        Finalize(j.id, j.lease_token, JobState.SUCCEEDED, Outcome.SUCCEEDED, ran_attempt=1)
        for j in claimed[:2]
    ]
    # a lone surrogate cannot even be sent to the database
    poison = Finalize(
        claimed[2].id, claimed[2].lease_token, JobState.FAILED, Outcome.FAILED, error="\ud800"
    )
    written: dict[int, bool] = {}

    async def scenario() -> None:
        async def flush(batch):
            return await asyncio.to_thread(
                app.backend.job_finalize_many, worker_id="w1", outcomes=batch
            )

        async def never(o):
            return False

        completer = Completer(flush, lambda o, ok: written.__setitem__(o.job_id, ok), never)
        completer.start()
        for o in [good[0], poison, good[1]]:
            completer.add(o)
        await completer.close()

    asyncio.run(scenario())
    assert written == {j.id: True for j in jobs}  # the poisoned one as a plain failure
    states = {j.id: app.get_job(j.id).state for j in jobs}
    assert states == {
        jobs[0].id: JobState.SUCCEEDED,
        jobs[1].id: JobState.SUCCEEDED,
        jobs[2].id: JobState.FAILED,
    }
    assert "could not be stored" in app.get_job(jobs[2].id).error


# -- 3. a handler cannot take the worker down -----------------------------------------------------
@pytest.mark.parametrize("how", ["sys.exit(0)", "sys.exit(3)", "KeyboardInterrupt"])
def test_a_handler_that_exits_fails_its_job_and_the_worker_goes_on(app, how):
    @app.task(max_attempts=1)
    def quitter():
        if how == "KeyboardInterrupt":
            raise KeyboardInterrupt
        sys.exit(int(how[-2]))

    @app.task
    async def aquitter():
        raise SystemExit(1)

    @app.task
    def fine(i):
        return i

    bad, abad = quitter.send(), aquitter.send(max_attempts=1)
    goods = fine.send_many([(i,) for i in range(5)])
    with Running(app) as running:
        wait_for(finished(app, bad.id, abad.id, *(g.id for g in goods)))
        assert running.thread.is_alive()
    assert app.get_job(bad.id).state == JobState.FAILED
    assert "the worker went on" in app.get_job(bad.id).error
    assert app.get_job(abad.id).state == JobState.FAILED
    assert all(app.get_job(g.id).state == JobState.SUCCEEDED for g in goods)


# -- 4. a sync job's timeout starts when it starts; it never runs after it was recorded ended ---
def test_a_sync_timeout_counts_from_the_start_of_the_handler(app):
    ran: list[str] = []

    @app.task(max_attempts=1, timeout=0.3)
    def stuck():
        time.sleep(1.5)  # ignores its timeout: its thread is given up on

    @app.task(max_attempts=1, timeout=1.0)
    def quick():
        time.sleep(0.1)
        ran.append("quick")

    first = stuck.send()
    second = quick.send()
    with Running(app, concurrency=1, fetch_batch=1):
        wait_for(finished(app, first.id, second.id), timeout=20)
    assert app.get_job(first.id).state == JobState.FAILED
    got = app.get_job(second.id)
    # it waited for a thread while the first one overran, yet it had its full second
    assert got.state == JobState.SUCCEEDED, got.error
    assert ran == ["quick"]


# -- 5. a sync handler learns that its job was lost; a requested cancel wins ---------------------
def test_a_sync_handler_sees_cancel_requested_when_its_job_is_lost(app):
    seen = threading.Event()
    started = threading.Event()

    @app.task(max_attempts=3)
    def patient():
        started.set()
        for _ in range(400):
            if cancel_requested():
                seen.set()
                return "stopped early"
            time.sleep(0.02)
        return "ran to the end"

    patient.send()
    with Running(app, worker_ttl_s=3, heartbeat_s=0.2, maintenance_s=60, grace_s=0.5):
        assert started.wait(10)
        # the leader judges this worker dead (time passed in): its job is rescued
        app.backend.job_rescue(worker_ttl_s=3, now=datetime.now(UTC) + timedelta(seconds=30))
        wait_for(seen.is_set, what="the sync handler told its job was lost")


def test_a_job_cancelled_while_running_ends_cancelled_even_if_it_returns(app):
    started = threading.Event()
    release = threading.Event()

    @app.task
    def stubborn():
        started.set()
        release.wait(10)
        return "done anyway"

    job = stubborn.send()
    with Running(app, heartbeat_s=5):  # the worker learns late
        assert started.wait(10)
        assert app.cancel_job(job.id) == "requested"
        release.set()
        wait_for(finished(app, job.id))
    got = app.get_job(job.id)
    assert got.state == JobState.CANCELLED
    assert [a.outcome for a in got.attempt_log()] == [Outcome.CANCELLED]


# -- 6. a handler blocking the event loop cannot starve the heartbeat ----------------------------
def test_an_async_handler_that_blocks_the_loop_keeps_its_job_and_is_reported(app, caplog):
    @app.task(max_attempts=3)
    async def blocker():
        time.sleep(4)  # blocks the loop: the wrong thing to do in an async handler
        return "done"

    job = blocker.send()
    caplog.set_level(logging.WARNING, logger="conveyor.worker")
    with Running(app, worker_ttl_s=2, heartbeat_s=0.3, maintenance_s=0.2):
        wait_for(finished(app, job.id), timeout=30)
    got = app.get_job(job.id)
    assert (got.state, got.attempts) == (JobState.SUCCEEDED, 1)  # never rescued, ran once
    blocked = [
        r.getMessage() for r in caplog.records if "event loop has been blocked" in r.getMessage()
    ]
    assert blocked and f"job {job.id} (blocker)" in blocked[0]


# -- 8/10. a worker takes only what it can run; burst workers stay while work remains -------------
def test_burst_workers_under_a_full_limit_stay_until_nothing_is_left(db_url):
    app = Conveyor(db_url)

    @app.task(queue="capped")
    async def step(i):
        await asyncio.sleep(0.01)

    app.set_queue_limit("capped", 3)
    jobs = step.send_many([(i,) for i in range(150)])
    workers = [Running(app, queues=["capped"], concurrency=3, burst=True) for _ in range(3)]
    for w in workers:
        w.__enter__()
    for w in workers:
        w.thread.join(120)
        assert not w.thread.is_alive(), "a burst worker did not stop"
    counts = app.count_jobs(ids=[j.id for j in jobs])
    assert counts == {JobState.SUCCEEDED: 150}  # nobody left early with work still waiting
    app.close()


# -- 9. code older than the schema stops claiming and exits ---------------------------------------
def test_a_worker_stops_when_the_schema_becomes_newer_than_its_code(app):
    @app.task
    def noop():
        return None

    with Running(app, heartbeat_s=0.2) as running:
        wait_for(lambda: running.worker.health(), what="the worker running")
        version = app.backend.latest_schema + 1
        app.backend._count("schema_version_insert", {"version": version, "name": "from_the_future"})
        running.thread.join(15)
        assert not running.thread.is_alive(), "the worker did not stop"
        assert running.worker.exit_code == 3
        job = noop.send()
        time.sleep(0.3)
        assert app.get_job(job.id).state == JobState.AVAILABLE


# -- 11-13. operator actions keep every invariant -----------------------------------------
def test_retrying_a_job_cancelled_while_running_runs_it_to_the_end(app):
    started = threading.Event()
    runs: list[int] = []

    @app.task
    async def work():
        runs.append(current_job().attempts)
        started.set()
        await asyncio.sleep(0.3 if len(runs) > 1 else 30)
        return "done"

    job = work.send()
    with Running(app, heartbeat_s=0.2):
        assert started.wait(10)
        app.cancel_job(job.id)
        wait_for(finished(app, job.id))
        assert app.get_job(job.id).state == JobState.CANCELLED
        assert app.retry_job(job.id)
        wait_for(finished(app, job.id))
    got = app.get_job(job.id)
    assert (got.state, got.result) == (JobState.SUCCEEDED, "done")


def test_retrying_a_failed_chain_step_runs_the_rest_of_the_chain(app):
    attempts: list[int] = []

    @app.task
    def first(x):
        return x + 1

    @app.task(max_attempts=1)
    def second(x):
        attempts.append(x)
        if len(attempts) == 1:
            raise ValueError("not yet")
        return x * 10

    @app.task
    def third(x):
        return f"result {x}"

    chain = app.chain(first.s(1), second.s(), third.s())
    with Running(app):
        with pytest.raises(Exception, match="step 2 \\(second\\) failed"):
            chain.wait(timeout=20)
        failed_step = chain.jobs()[-1]
        assert app.retry_job(failed_step.id)
        assert chain.result(timeout=20) == "result 20"
    assert [j.task for j in chain.jobs()] == ["first", "second", "third"]


def test_retrying_a_failed_job_of_a_closed_batch_calls_back_again(app):
    calls: list[dict] = []
    fail_once = {"left": 1}

    @app.task(max_attempts=1)
    def item(i):
        if i == 2 and fail_once["left"]:
            fail_once["left"] -= 1
            raise ValueError("first time")
        return i

    @app.task
    def summary(batch_id, counts):
        calls.append(counts)

    batch = item.batch([(i,) for i in range(4)], on_complete=summary)
    with Running(app):
        assert batch.wait(timeout=20).state == "completed_with_failures"
        wait_for(lambda: len(calls) == 1)
        [failed] = [j for j in batch.jobs() if j.state == JobState.FAILED]
        assert app.retry_job(failed.id)
        assert batch.wait(timeout=20).state == "succeeded"
        wait_for(lambda: len(calls) == 2)
    assert calls == [{"succeeded": 3, "failed": 1}, {"succeeded": 4}]


def test_a_batch_whose_callback_fails_says_so(app):
    @app.task
    def item(i):
        return i

    @app.task(max_attempts=1)
    def summary(batch_id, counts):
        raise RuntimeError("report service down")

    batch = item.batch([(1,), (2,)], on_complete=summary)
    with Running(app):
        batch.wait(timeout=20)
        wait_for(lambda: batch.refresh().state == "callback_failed", what="the callback failed")


# -- 15. bulk actions by filter ------------------------------------------------------------------
def test_bulk_retry_by_filter_counts_first_then_retries_in_slices(app):
    @app.task(max_attempts=1)
    def boom(i):
        raise Permanent("no")

    boom.send_many([(i,) for i in range(7)])
    with Running(app):
        wait_for(lambda: app.count_jobs() == {JobState.FAILED: 7})
    dry = app.retry_jobs(state=JobState.FAILED, task="boom", dry_run=True)
    assert (dry.matched, dry.done) == (7, 0) and app.count_jobs() == {JobState.FAILED: 7}
    done = app.retry_jobs(state=JobState.FAILED, task="boom")
    assert (done.matched, done.done) == (7, 7)
    assert app.count_jobs() == {JobState.AVAILABLE: 7}
    assert app.delete_jobs(task="boom").done == 7 and app.count_jobs() == {}


# -- error classification is a hook ----------------------------------------------------------------
def test_a_task_classifier_decides_retry_budget_and_delay_per_exception(app):
    class RateLimited(Exception):
        pass

    def classify(exc, job):
        if isinstance(exc, RateLimited):
            return Retry(delay=0.05, max_attempts=4)
        if isinstance(exc, KeyError):
            return Fail("bad input")
        return None

    calls: list[str] = []

    @app.task(max_attempts=1, classify=classify)
    def api(kind):
        calls.append(kind)
        if kind == "limited" and calls.count("limited") < 3:
            raise RateLimited()
        if kind == "bad":
            raise KeyError("x")
        return "ok"

    limited, bad = api.send("limited"), api.send("bad")
    with Running(app):
        wait_for(finished(app, limited.id, bad.id))
    got = app.get_job(limited.id)
    assert (got.state, got.attempts, got.max_attempts) == (JobState.SUCCEEDED, 3, 4)
    assert "bad input" in app.get_job(bad.id).error


# -- 22. smaller things --------------------------------------------------------------------------
def test_keyed_sends_say_whether_they_created_a_job(app):
    @app.task
    def once():
        return None

    first = once.send(idempotency_key="k")
    again = once.send(idempotency_key="k")
    assert first.created and not again.created and again.id == first.id


def test_run_at_schedules_at_a_time(app):
    @app.task
    def later():
        return None

    at = datetime.now(UTC) + timedelta(hours=1)
    began = time.monotonic()
    job = later.send(run_at=at)
    took = time.monotonic() - began
    assert job.state == JobState.SCHEDULED
    # run_at travels as a delay from the sender's clock, added to the server's
    # clock when the row is written: off by at most the send's own time (over 1 s
    # once on a loaded CI machine)
    assert abs((app.get_job(job.id).scheduled_at - at).total_seconds()) < 1 + took


def test_next_stage_after_a_cancel_request_ends_cancelled(app):
    started = threading.Event()
    release = threading.Event()

    @app.task
    def staged():
        started.set()
        release.wait(10)
        return NextStage("two")

    job = staged.send()
    with Running(app, heartbeat_s=5):
        assert started.wait(10)
        app.cancel_job(job.id)
        release.set()
        wait_for(finished(app, job.id))
    got = app.get_job(job.id)
    assert (got.state, got.stage) == (JobState.CANCELLED, None)


# -- 19. SQLite: a transaction held open elsewhere gives a clear error, not a raw one ------
def test_a_long_sqlite_transaction_elsewhere_gives_a_clear_error(tmp_path):
    import sqlite3

    from conveyor import DatabaseUnavailable

    path = tmp_path / "locked.db"
    app = Conveyor(f"sqlite:///{path}?busy_timeout=0.3")

    @app.task
    def noop():
        return None

    app.migrate()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a producer's conn= transaction left open
    try:
        locked = r"stayed locked for 0\.3s: another connection"
        with pytest.raises(DatabaseUnavailable, match=locked):
            noop.send()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert noop.send().id  # once it ends, all is well
    app.close()


# -- 20. an outcome that committed before the connection broke is its job's one success ------
def test_an_outcome_resent_after_a_lost_connection_is_recognised_as_written(app):
    from conveyor import DatabaseUnavailable

    @app.task
    def noop():
        return None

    job = noop.send()
    [claimed] = app.backend.job_claim(queues=["default"], worker_id="w1", limit=1)
    outcome = Finalize(
        claimed.id, claimed.lease_token, JobState.SUCCEEDED, Outcome.SUCCEEDED, ran_attempt=1
    )
    written: list[tuple[int, bool]] = []
    calls = {"n": 0}

    async def scenario() -> None:
        async def flush(batch):
            calls["n"] += 1
            accepted = await asyncio.to_thread(
                app.backend.job_finalize_many, worker_id="w1", outcomes=batch
            )
            if calls["n"] == 1:  # committed, then the answer was lost
                raise DatabaseUnavailable("connection lost after the commit")
            return accepted

        async def check(o):
            return await asyncio.to_thread(
                app.backend.job_outcome_written, outcome=o, worker_id="w1"
            )

        completer = Completer(flush, lambda o, ok: written.append((o.job_id, ok)), check)
        completer.start()
        completer.add(outcome)
        await completer.close()

    asyncio.run(scenario())
    assert calls["n"] == 2 and written == [(job.id, True)]  # not reported as refused
    assert [a.outcome for a in app.get_job(job.id).attempt_log()] == [Outcome.SUCCEEDED]
