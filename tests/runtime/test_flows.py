"""Batches, multi-stage jobs and chains, run by a real worker, on both backends."""

from __future__ import annotations

import asyncio
import threading

import pytest

from conveyor import (
    BadArguments,
    ChainFailed,
    ConfigError,
    NextStage,
    Permanent,
    chain,
    current_job,
)
from conveyor.errors import KeyReused

from .helpers import Running, wait_for

FAST = {"base": 0.05, "factor": 2, "cap": 0.2, "jitter": 0}


def test_batch_runs_closes_and_calls_back_once(app):
    calls = []

    @app.task(max_attempts=1)
    async def square(x):
        if x == 7:
            raise Permanent("seven is not welcome")
        return x * x

    @app.task(queue="callbacks")
    def summarise(batch_id, counts):
        calls.append((batch_id, counts))
        return "summarised"

    batch = square.batch([(i,) for i in range(30)], name="squares", on_complete=summarise)
    assert (batch.total, batch.state, batch.name, batch.created) == (30, "running", "squares", True)
    with Running(app, queues=["default", "callbacks"], concurrency=8, flow_poll_s=0.2):
        seen = [job.id for job in batch.as_completed(timeout=30)]
        closed = batch.wait(timeout=30)
        wait_for(lambda: calls, what="on_complete ran")
    assert sorted(seen) == sorted(j.id for j in batch.jobs())
    assert closed.state == "completed_with_failures"
    assert closed.counts == {"succeeded": 29, "failed": 1}
    assert calls == [(batch.id, {"succeeded": 29, "failed": 1})]
    results = batch.results()
    assert results[3] == 9 and results[7] is None
    progress = batch.progress()
    assert progress == {
        "total": 30,
        "succeeded": 29,
        "failed": 1,
        "cancelled": 0,
        "running": 0,
        "pending": 0,
        "percent": 100,
        "eta_s": 0,
        "state": "completed_with_failures",
    }


def test_progress_while_running(app):
    gate = threading.Event()

    @app.task
    def held(i):
        gate.wait(20)
        return i

    batch = held.batch([(i,) for i in range(6)])
    with Running(app, concurrency=2):
        wait_for(lambda: batch.progress()["running"] == 2, what="two running")
        p = batch.progress()
        assert (p["total"], p["running"], p["pending"], p["percent"]) == (6, 2, 4, 0)
        assert p["state"] == "running" and p["eta_s"] is None
        gate.set()
        assert batch.wait(timeout=20).state == "succeeded"


def test_idempotent_batch_creation_returns_the_first(app):
    @app.task
    def noop(i):
        return i

    first = noop.batch([(1,), (2,)], idempotency_key="req-77", priority=3)
    again = noop.batch([(1,), (2,)], idempotency_key="req-77", priority=3)
    assert again.id == first.id and again.created is False and again.total == 2
    # the key names one batch: a repeat asking for another is refused, writing nothing
    for items, options in [
        ([(1,), (2,), (3,)], {"priority": 3}),
        ([(1,), (9,)], {}),
        ([(1,), (2,)], {}),
    ]:
        with pytest.raises(KeyReused, match=r"idempotency_key: 'req-77' was already used") as info:
            noop.batch(items, idempotency_key="req-77", **options)
        assert isinstance(info.value, ConfigError) and f"batch {first.id}" in str(info.value)
    assert len(app.list_jobs()) == 2 and [b.id for b in app.list_batches()] == [first.id]


def test_a_batch_key_never_tells_whether_a_sensitive_argument_matched(app):
    @app.task(sensitive=("password",))
    def login(user, password):
        return user

    first = login.batch([("ada", "hunter2")], idempotency_key="acct")
    for guess in ("password1", "hunter2"):  # the same answer, right or wrong
        again = login.batch([("ada", guess)], idempotency_key="acct")
        assert (again.id, again.created) == (first.id, False)
    with pytest.raises(KeyReused):  # what is not sensitive still counts
        login.batch([("bob", "hunter2")], idempotency_key="acct")


def test_a_batch_keyed_before_fingerprints_is_compared_on_task_and_size(app):
    from tests.backend.helpers import ins

    @app.task
    def noop(i):
        return i

    # as a batch written before schema v21 is: a key, no fingerprint
    old, _ = app.backend.batch_create(
        name=None,
        task=noop.name,
        idempotency_key="before-v21",
        on_complete_json=None,
        jobs=[ins(task=noop.name, queue="default", args=[i]) for i in range(2)],
    )
    again = noop.batch([(7,), (8,)], idempotency_key="before-v21")
    assert (again.id, again.created, again.record.fingerprint) == (old, False, None)
    with pytest.raises(KeyReused, match=f"batch {old}, task 'noop', 2 items"):
        noop.batch([(7,)], idempotency_key="before-v21")


def test_batch_cancel_and_retry_failed(app):
    flaky_ok = threading.Event()

    @app.task(max_attempts=1)
    def sometimes(i):
        if i == 0 and not flaky_ok.is_set():
            raise ValueError("not yet")
        return i

    batch = sometimes.batch([(i,) for i in range(3)])
    with Running(app, flow_poll_s=0.2):
        closed = batch.wait(timeout=20)
        assert closed.state == "completed_with_failures"
        flaky_ok.set()
        assert batch.retry_failed() == 1
        assert batch.wait(timeout=20).state == "succeeded"

    later = sometimes.batch([(i,) for i in range(5)], delay=60)
    assert later.cancel() == 5
    with Running(app, flow_poll_s=0.2):
        assert later.wait(timeout=20).state == "cancelled"


def test_a_large_batch_is_made_in_chunks_and_a_bad_item_writes_nothing(app):
    """A batch without keys or limits is written while its items are encoded,
    a chunk at a time (PostgreSQL: by COPY): every item in order, with the
    batch's id; an item that fails its check halfway leaves no batch and no job."""

    @app.task
    def pair(i, label="x"):
        return i

    batch = pair.batch([(i,) for i in range(1200)] + [{"i": -1, "label": "kw"}], delay=60)
    assert (batch.total, batch.created, batch.state) == (1201, True, "running")
    assert app.batch_progress(batch.id) == {"scheduled": 1201}
    jobs = batch.jobs()
    assert [j.args for j in jobs[:3]] == [[0], [1], [2]] and jobs[-1].kwargs == {
        "i": -1,
        "label": "kw",
    }
    assert [j.args for j in jobs[:1200]] == [[i] for i in range(1200)]
    assert {j.batch_id for j in jobs} == {batch.id}
    assert pair.batch([]).total == 0
    before = (len(app.list_batches()), app.count_jobs())
    assert before == (2, {"scheduled": 1201})
    with pytest.raises(BadArguments, match="item 1000: bad arguments for task 'pair'"):
        pair.batch([(i,) for i in range(1000)] + [(1, 2, 3)] + [(i,) for i in range(300)])
    with pytest.raises(TypeError, match="item 700"):
        pair.batch([(i,) for i in range(700)] + ["not a tuple"])
    assert (len(app.list_batches()), app.count_jobs()) == before


def test_batch_joins_the_callers_transaction(app):
    from tests.backend.helpers import raw_connection

    @app.task
    def noop(i):
        return i

    conn = raw_connection(app.backend)
    try:
        noop.batch([(1,), (2,)], conn=conn, name="rolled back")
        conn.rollback()
    finally:
        conn.close()
    assert app.list_batches() == [] and app.list_jobs() == []


def test_multi_stage_job_retries_only_the_failing_stage(app):
    runs = []

    @app.task(max_attempts=3, backoff=FAST)
    async def document(url):
        job = current_job()
        runs.append((job.stage, job.attempts))
        if job.stage is None:
            return NextStage("ocr", context={"pages": 2, "url": url})
        if job.stage == "ocr":
            if job.attempts == 1:
                raise ConnectionError("ocr service down")
            return NextStage("index", context={**job.context, "text": "hello"}, priority=5)
        return {"indexed": job.context["text"], "pages": job.context["pages"]}

    job = document.send("http://x/doc.pdf")
    with Running(app):
        wait_for(lambda: app.get_job(job.id).state.finished, what="document done")
    got = app.get_job(job.id)
    assert (got.state, got.stage, got.result) == (
        "succeeded",
        "index",
        {"indexed": "hello", "pages": 2},
    )
    assert got.priority == 5 and got.attempts == 1
    assert runs == [(None, 1), ("ocr", 1), ("ocr", 2), ("index", 1)]
    log = [(a.stage, a.attempt, a.outcome) for a in got.attempt_log()]
    assert log == [
        (None, 1, "stage"),
        ("ocr", 1, "retry"),
        ("ocr", 2, "stage"),
        ("index", 1, "succeeded"),
    ]


def test_chain_passes_results_along(app):
    @app.task
    def add(a, b):
        return a + b

    @app.task
    async def double(x):
        await asyncio.sleep(0)
        return x * 2

    @app.task
    def describe(x, unit="items"):
        return f"{x} {unit}"

    c1 = add.send(2, 3).then(double).then(describe.s(unit="apples"))
    c2 = chain(add.s(1, 1), double.s(), double.s())
    with Running(app, flow_poll_s=0.2):
        assert c1.result(timeout=20) == "10 apples"
        assert c2.result(timeout=20) == 8
    assert [j.task for j in c1.jobs()] == ["add", "double", "describe"]
    assert all(j.chain_root == c1.id for j in c1.jobs()[1:])


def test_a_failed_step_fails_the_chain_with_its_reason(app):
    ran = []

    @app.task(max_attempts=1)
    def explode(x):
        raise Permanent(f"cannot handle {x}")

    @app.task
    def never(x):
        ran.append(x)

    @app.task
    def one():
        return 1

    c = chain(one.s(), explode.s(), never.s())
    with Running(app, flow_poll_s=0.2), pytest.raises(ChainFailed) as failure:
        c.wait(timeout=20)
    assert "step 2 (explode) failed" in str(failure.value)
    assert "cannot handle 1" in str(failure.value)
    assert ran == [] and len(c.jobs()) == 2


def test_chain_steps_are_checked_when_the_chain_is_made(app):
    from conveyor import BadArguments

    @app.task
    def one():
        return 1

    @app.task
    def takes_nothing():
        return 0

    with pytest.raises(BadArguments, match="takes_nothing"):
        chain(one.s(), takes_nothing.s())
    assert app.list_jobs() == []
