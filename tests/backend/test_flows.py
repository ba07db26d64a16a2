"""FlowStore: batches (scatter + aggregate), multi-stage jobs and chains."""

from __future__ import annotations

import json
import threading

from conveyor.records import Finalize, JobFilter

from .helpers import done, fetch, finish_all, ins, later, make_batch


def test_batch_create_writes_the_row_and_its_jobs(backend):
    batch_id, created = make_batch(backend, n=5)
    assert created
    record = backend.batch_get(batch_id=batch_id)
    assert (record.total, record.state, record.name, record.task) == (5, "running", "b", "t")
    assert backend.batch_progress(batch_id=batch_id) == {"available": 5}
    assert [j.args for j in backend.batch_jobs(batch_id=batch_id)] == [[i] for i in range(5)]
    assert all(j.batch_id == batch_id for j in backend.batch_jobs(batch_id=batch_id))


def test_batch_idempotency_key_returns_the_existing_batch(backend):
    first, _ = make_batch(backend, n=4, key="req-77")
    again, created = make_batch(backend, n=9, key="req-77")
    assert (again, created) == (first, False)
    assert sum(backend.batch_progress(batch_id=first).values()) == 4
    assert len(backend.job_list(filter=JobFilter(), limit=100)) == 4


def test_a_batch_keeps_the_fingerprint_it_was_created_with(backend):
    def create(fingerprint, n=2):
        jobs = [ins(args=[i]) for i in range(n)]
        return backend.batch_create(
            name="b",
            task="t",
            idempotency_key="req-8",
            on_complete_json=None,
            jobs=jobs,
            fingerprint=fingerprint,
        )

    first, created = create("sha256:" + "a" * 64)
    assert created and backend.batch_get(batch_id=first).fingerprint == "sha256:" + "a" * 64
    # a repeat under the key writes nothing, its fingerprint neither: the caller compares
    assert create("sha256:" + "b" * 64, n=5) == (first, False)
    assert backend.batch_get(batch_id=first).fingerprint == "sha256:" + "a" * 64
    [listed] = backend.batch_list(state=None, limit=10, before_id=None)
    assert listed.fingerprint == "sha256:" + "a" * 64
    unkeyed, _ = make_batch(backend, n=1)
    assert backend.batch_get(batch_id=unkeyed).fingerprint is None


def test_racing_batch_creation_with_one_key_makes_one_batch(backend):
    results: list = []
    barrier = threading.Barrier(6)

    def race() -> None:
        barrier.wait()
        results.append(make_batch(backend, n=10, key="race"))

    threads = [threading.Thread(target=race) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({bid for bid, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert len(backend.job_list(filter=JobFilter(), limit=1000)) == 10


def test_batch_closes_once_with_counts_and_one_callback(backend):
    batch_id, _ = make_batch(backend, n=3)
    assert backend.batch_ready() == []
    a, b, c = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(a), done(b), done(c, state="failed")])
    assert backend.batch_ready() == [batch_id]
    closed = backend.batch_close(batch_id=batch_id)
    assert closed.state == "completed_with_failures"
    assert closed.counts == {"succeeded": 2, "failed": 1}
    assert closed.finished_at is not None
    assert backend.batch_close(batch_id=batch_id) is None  # closed already
    assert backend.batch_ready() == []
    [callback] = backend.job_list(filter=JobFilter(tasks="summarise"))
    assert (callback.queue, callback.args) == (
        "callbacks",
        [batch_id, {"succeeded": 2, "failed": 1}],
    )


def test_a_fully_successful_batch_closes_succeeded(backend):
    batch_id, _ = make_batch(backend, n=2, on_complete=None)
    finish_all(backend)
    assert backend.batch_close(batch_id=batch_id).state == "succeeded"
    assert backend.job_list(filter=JobFilter(tasks="summarise")) == []


def test_an_empty_batch_closes_at_once(backend):
    batch_id, _ = make_batch(backend, n=0)
    assert backend.batch_ready() == [batch_id]
    assert backend.batch_close(batch_id=batch_id).state == "succeeded"


def test_cancel_stops_pending_jobs_and_closes_without_callback(backend):
    batch_id, _ = make_batch(backend, n=4)
    [running] = fetch(backend, n=1)
    assert backend.batch_cancel(batch_id=batch_id) == 3
    assert backend.batch_progress(batch_id=batch_id) == {"running": 1, "cancelled": 3}
    assert backend.batch_ready() == []  # the running job still counts
    backend.job_finalize_many(worker_id="w1", outcomes=[done(running)])
    closed = backend.batch_close(batch_id=batch_id)
    assert closed.state == "cancelled" and closed.cancelled_at is not None
    assert backend.job_list(filter=JobFilter(tasks="summarise")) == []
    assert backend.batch_cancel(batch_id=batch_id) == 0


def test_retry_failed_reopens_and_the_next_closing_calls_back_again(backend):
    batch_id, _ = make_batch(backend, n=2)
    a, b = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(a), done(b, state="failed")])
    backend.batch_close(batch_id=batch_id)
    assert backend.batch_retry_failed(batch_id=batch_id) == 1
    assert backend.batch_get(batch_id=batch_id).state == "running"
    assert backend.batch_retry_failed(batch_id=batch_id) == 0
    [again] = fetch(backend)
    assert again.id == b.id and again.attempts == 2
    backend.job_finalize_many(worker_id="w1", outcomes=[done(again)])
    closed = backend.batch_close(batch_id=batch_id)
    assert (closed.state, closed.closings) == ("succeeded", 2)
    callbacks = backend.job_list(filter=JobFilter(tasks="summarise"))
    assert len(callbacks) == 2
    assert {c.idempotency_key for c in callbacks} == {
        f"conveyor:batch:{batch_id}:close:1",
        f"conveyor:batch:{batch_id}:close:2",
    }


def test_finished_jobs_page_in_completion_order(backend):
    batch_id, _ = make_batch(backend, n=3)
    a, b, c = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(c)], now=later(1))
    backend.job_finalize_many(worker_id="w1", outcomes=[done(a)], now=later(2))
    first = backend.batch_finished_jobs(batch_id=batch_id)
    assert [j.id for j in first] == [c.id, a.id]
    cursor = (first[-1].finished_at, first[-1].id)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(b)], now=later(3))
    assert [j.id for j in backend.batch_finished_jobs(batch_id=batch_id, after=cursor)] == [b.id]


# -- stages ------------------------------------------------------------------------------
def test_stage_outcome_requeues_same_job_with_fresh_attempts(backend):
    [res] = backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend)
    stage = Finalize(
        job.id,
        job.lease_token,
        "available",
        "stage",
        next_stage="ocr",
        context_json='{"pages": 3}',
        ran_attempt=1,
        ran_stage=None,
        priority=7,
    )
    assert backend.job_finalize_many(worker_id="w1", outcomes=[stage]) == [res.id]
    got = backend.job_get(job_id=res.id)
    assert (got.state, got.stage, got.context, got.attempts, got.priority) == (
        "available",
        "ocr",
        {"pages": 3},
        0,
        7,
    )
    [again] = fetch(backend)
    assert (again.id, again.stage, again.attempts, again.context) == (
        res.id,
        "ocr",
        1,
        {"pages": 3},
    )
    [attempt] = backend.job_attempts(job_id=res.id)
    assert (attempt.outcome, attempt.stage, attempt.attempt) == ("stage", None, 1)


# -- chains ------------------------------------------------------------------------------
STEP = {**ins(task="next", queue="q")._asdict(), "args": ["x"], "kwargs": {}}


def test_chain_links_advance_once(backend):
    from conveyor.flow import next_step_insert

    [res] = backend.job_insert_many(jobs=[ins()._replace(chain_json=json.dumps([STEP, STEP]))])
    assert backend.job_chain_append(job_id=res.id, steps_json=json.dumps([STEP])) is True
    assert backend.job_chain_due() == []  # not finished yet
    [job] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job, result_json='{"r": 1}')])
    [link] = backend.job_chain_due()
    assert (link.id, link.state, len(link.chain)) == (res.id, "succeeded", 3)
    nxt = next_step_insert(link.id, link.chain_root, link.result_json, link.chain)
    next_id = backend.job_chain_advance(job_id=link.id, next_job=nxt, state=link.state)
    assert (
        backend.job_chain_advance(job_id=link.id, next_job=nxt, state=link.state) == next_id
    )  # idempotent
    assert backend.job_chain_due() == []
    child = backend.job_get(job_id=next_id)
    assert (child.task, child.args, child.chain_root) == ("next", [{"r": 1}, "x"], res.id)
    assert len(child.chain) == 2
    assert backend.job_get(job_id=res.id).chain_next == next_id
    assert backend.job_chain_append(job_id=res.id, steps_json="[]") is False


def test_failed_step_ends_the_chain(backend):
    [res] = backend.job_insert_many(jobs=[ins()._replace(chain_json=json.dumps([STEP]))])
    [job] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job, state="failed", error="x")])
    [link] = backend.job_chain_due()
    assert backend.job_chain_advance(job_id=link.id, next_job=None, state=link.state) is None
    assert backend.job_get(job_id=res.id).chain_next == 0
    assert backend.job_chain_due() == []


# -- leadership ----------------------------------------------------------------------------


def test_retrying_a_failed_job_of_a_closed_batch_reopens_it_and_calls_back_again(backend):
    batch_id, _ = make_batch(backend, n=2)
    a, b = fetch(backend, n=10)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(a), done(b, state="failed")])
    first = backend.batch_close(batch_id=batch_id)
    assert first.state == "completed_with_failures" and first.counts == {
        "succeeded": 1,
        "failed": 1,
    }
    assert backend.job_retry_many(filter=JobFilter(ids=[b.id])) == [b.id]
    reopened = backend.batch_get(batch_id=batch_id)
    assert (reopened.state, reopened.counts) == ("running", None)
    [again] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(again)])
    closed = backend.batch_close(batch_id=batch_id)
    assert closed.state == "succeeded" and closed.counts == {"succeeded": 2}
    assert len(backend.job_list(filter=JobFilter(tasks="summarise"))) == 2  # called back again


def test_a_failed_callback_shows_on_the_batch(backend):
    batch_id, _ = make_batch(backend, n=1)
    finish_all(backend)
    closed = backend.batch_close(batch_id=batch_id)
    assert closed.state == "succeeded" and closed.callback_job_id is not None
    [callback] = fetch(backend, queues=("callbacks",))
    assert callback.id == closed.callback_job_id
    backend.job_finalize_many(worker_id="w1", outcomes=[done(callback, state="failed", error="x")])
    got = backend.batch_get(batch_id=batch_id)
    assert (got.state, got.callback_state) == ("callback_failed", "failed")
    assert [b.state for b in backend.batch_list()] == ["callback_failed"]


def test_retrying_a_failed_chain_step_resumes_the_chain(backend):
    step = {"queue": "q", "task": "t", "args": [], "kwargs": {}}
    [res] = backend.job_insert_many(jobs=[ins()._replace(chain_json=json.dumps([step]))])
    [job] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job, state="failed", error="x")])
    [link] = backend.job_chain_due()
    backend.job_chain_advance(
        job_id=link.id, next_job=None, state=link.state
    )  # the chain ended here
    assert backend.job_get(job_id=res.id).chain_next == 0
    assert backend.job_retry_many(filter=JobFilter(ids=[res.id])) == [res.id]
    assert backend.job_get(job_id=res.id).chain_next is None  # open again
    [again] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(again, result_json="5")])
    assert [link.id for link in backend.job_chain_due()] == [res.id]  # the next step is due


def test_a_retry_between_reading_a_failed_step_and_linking_it_keeps_the_chain_open(backend):
    # The linker read the step as failed; an operator retried it before the link was
    # written. The stale "chain ended here" must not be written on the rerun (it
    # used to be: the rerun then succeeded with the chain marked ended, and the
    # chain's result was the middle step's).
    step = {"queue": "q", "task": "t", "args": [], "kwargs": {}}
    [res] = backend.job_insert_many(jobs=[ins()._replace(chain_json=json.dumps([step]))])
    [job] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job, state="failed", error="x")])
    [stale] = backend.job_chain_due()
    assert backend.job_retry_many(filter=JobFilter(ids=[res.id])) == [res.id]
    assert backend.job_chain_advance(job_id=stale.id, next_job=None, state=stale.state) is None
    assert backend.job_get(job_id=res.id).chain_next is None  # still open
    [again] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(again, result_json="5")])
    [link] = backend.job_chain_due()
    assert link.state == "succeeded"
    from conveyor.flow import next_step_insert

    nxt = next_step_insert(link.id, link.chain_root, link.result_json, link.chain)
    next_id = backend.job_chain_advance(job_id=link.id, next_job=nxt, state=link.state)
    assert next_id and backend.job_get(job_id=res.id).chain_next == next_id
