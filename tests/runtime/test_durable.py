"""Durable steps with a real worker (in a thread), on every database: a retry
reuses the steps that returned, a sleep and a wait end the attempt without using
it up, an event wakes its waiter (emitted before the wait, or after), the first
payload wins, a timeout raises ``EventTimeout``; sync and async handlers alike."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest

from conveyor import Conveyor, EventTimeout, JobRecord, current_job

from .helpers import Running, finished, wait_for


@pytest.fixture
def calls() -> Counter[str]:
    return Counter()


def _register(app: Conveyor, calls: Counter[str]) -> None:
    lock = threading.Lock()

    def effect(name: str, value: object) -> object:
        with lock:
            calls[name] += 1
        return value

    @app.task(name="flaky_sync", max_attempts=3, backoff={"base": 0.01, "factor": 1, "jitter": 0})
    def flaky_sync(x: int) -> list:
        ctx = current_job()
        one = ctx.step("one", effect, "sync-one", {"x": x})
        if ctx.attempts == 1:
            raise RuntimeError("fails after step one, once")
        two = ctx.step("two", effect, "sync-two", x + 1)
        return [one, two, ctx.attempts]

    @app.task(name="flaky_async", max_attempts=3, backoff={"base": 0.01, "factor": 1, "jitter": 0})
    async def flaky_async(x: int) -> list:
        ctx = current_job()

        async def one() -> dict:
            return effect("async-one", {"x": x})  # type: ignore[return-value]

        first = await ctx.step("one", one)
        if ctx.attempts == 1:
            raise RuntimeError("fails after step one, once")
        second = await ctx.step("two", effect, "async-two", x + 1)
        return [first, second, ctx.attempts]

    @app.task(name="napper")
    async def napper() -> str:
        ctx = current_job()
        await ctx.step("before", effect, "nap-before", 1)
        await ctx.sleep("nap", timedelta(seconds=0.3))
        await ctx.step("after", effect, "nap-after", 2)
        return "rested"

    @app.task(name="waiter")
    def waiter(key: str, wait_s: float) -> object:
        ctx = current_job()
        ctx.step("first", effect, f"wait-first-{key}", 0)
        try:
            payload = ctx.wait_for_event(key, timeout=wait_s)
        except EventTimeout as exc:
            return f"timed out: {exc.key}"
        return {"payload": payload}

    @app.task(name="bad_step")
    def bad_step() -> None:
        current_job().step("obj", lambda: object())

    @app.task(name="bad_name")
    def bad_name(verb: str, bad: str) -> None:
        ctx = current_job()
        if verb == "step":
            ctx.step(bad, effect, "never", 0)
        elif verb == "sleep":
            ctx.sleep(bad, 0)
        elif verb == "wait":
            ctx.wait_for_event(bad)
        else:
            ctx.wait_for_event("k", name=bad)


@pytest.fixture
def durable_app(app: Conveyor, calls: Counter[str]) -> Conveyor:
    _register(app, calls)
    return app


def test_current_job_is_still_the_job_record(durable_app):
    @durable_app.task(name="fields")
    def fields() -> list:
        job = current_job()
        assert isinstance(job, JobRecord)
        return [job.id, job.attempts, job.stage, job.task]

    job = fields.send()
    with Running(durable_app):
        wait_for(finished(durable_app, job.id))
    assert durable_app.get_job(job.id).result == [job.id, 1, None, "fields"]


@pytest.mark.parametrize("task", ["flaky_sync", "flaky_async"])
def test_a_retry_reuses_the_steps_that_returned(durable_app, calls, task):
    job = durable_app.tasks[task].send(5)
    with Running(durable_app):
        wait_for(finished(durable_app, job.id))
    done = durable_app.get_job(job.id)
    assert done.state == "succeeded", done.error
    assert done.result == [{"x": 5}, 6, 2]
    prefix = task.removeprefix("flaky_")
    assert calls == {f"{prefix}-one": 1, f"{prefix}-two": 1}


def test_a_sleep_ends_the_attempt_without_using_it(durable_app, calls):
    job = durable_app.tasks["napper"].send()
    with Running(durable_app):
        wait_for(finished(durable_app, job.id))
    done = durable_app.get_job(job.id)
    assert (done.state, done.result, done.attempts) == ("succeeded", "rested", 1)
    assert calls == {"nap-before": 1, "nap-after": 1}
    outcomes = [a.outcome for a in durable_app.job_attempts(job.id)]
    assert outcomes == ["snoozed", "succeeded"]


def test_an_event_wakes_its_waiter(durable_app, calls):
    job = durable_app.tasks["waiter"].send("paid:1", 3600)
    with Running(durable_app):
        wait_for(lambda: durable_app.get_job(job.id).state == "scheduled", what="the wait")
        emitted = durable_app.emit_event("paid:1", {"amount": 30})
        assert emitted.created
        wait_for(finished(durable_app, job.id))
    done = durable_app.get_job(job.id)
    assert (done.state, done.result) == ("succeeded", {"payload": {"amount": 30}})
    assert calls == {"wait-first-paid:1": 1}
    assert done.attempts == 1


def test_an_event_emitted_before_the_wait_is_not_lost_and_the_first_payload_wins(durable_app):
    assert durable_app.emit_event("early", "first").created
    second = durable_app.emit_event("early", "second")
    assert (second.created, second.woken) == (False, 0)
    job = durable_app.tasks["waiter"].send("early", 3600)
    with Running(durable_app):
        wait_for(finished(durable_app, job.id))
    done = durable_app.get_job(job.id)
    assert (done.result, done.attempts) == ({"payload": "first"}, 1)
    assert [a.outcome for a in durable_app.job_attempts(job.id)] == ["succeeded"]


def test_a_wait_past_its_timeout_raises_event_timeout(durable_app):
    job = durable_app.tasks["waiter"].send("never", 0.2)
    with Running(durable_app):
        wait_for(finished(durable_app, job.id))
    done = durable_app.get_job(job.id)
    assert (done.state, done.result) == ("succeeded", "timed out: never")


def test_a_step_result_json_cannot_hold_fails_the_job_clearly(durable_app):
    job = durable_app.tasks["bad_step"].send()
    with Running(durable_app):
        wait_for(finished(durable_app, job.id))
    done = durable_app.get_job(job.id)
    assert done.state == "failed" and done.attempts == 1
    assert "step 'obj' returned a value that cannot be stored as JSON" in done.error


def test_a_step_name_or_event_key_with_a_control_character_fails_the_job_at_once(
    durable_app, calls
):
    # a newline or an escape could forge or garble a line where the CLI and the
    # dashboard show it: refused as every name is (checks.check_name), as a StepError
    cases = {
        ("step", "a\nb"): "name: a step's name",
        ("sleep", "\x1b[31mred"): "name: a step's name",
        ("wait", "paid\r1"): "key: an event key",
        ("wait-named", "a\tb"): "name: a step's name",
        ("step", "a\u2028b"): "name: a step's name",
    }
    jobs = {durable_app.tasks["bad_name"].send(*case).id: what for case, what in cases.items()}
    with Running(durable_app):
        for job_id in jobs:
            wait_for(finished(durable_app, job_id))
    for job_id, what in jobs.items():
        done = durable_app.get_job(job_id)
        assert (done.state, done.attempts) == ("failed", 1), done
        assert f"{what} must be a non-empty printable string" in done.error, done.error
    assert calls == {}  # no step ran
