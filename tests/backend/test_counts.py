"""Counts from the rollup the database keeps (no scan): exact after every kind of
change, before and after the leader folds the deltas."""

from __future__ import annotations

from conveyor.records import JobFilter

from .helpers import done, fetch, ins, later


def counts(backend):
    return {(c.queue, c.task, c.state): c.count for c in backend.queue_counts()}


def truth(backend):
    out: dict = {}
    for j in backend.job_list(filter=JobFilter(), limit=10_000):
        key = (j.queue, j.task, str(j.state))
        out[key] = out.get(key, 0) + 1
    return out


def test_counts_follow_every_change_exactly(backend):
    _a, _b, c, _d = backend.job_insert_many(
        jobs=[ins(task="x"), ins(task="x"), ins(task="y", queue="r"), ins(task="x", delay_s=60)]
    )
    assert counts(backend) == truth(backend)
    j1, j2 = fetch(backend, n=2)
    assert counts(backend) == truth(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(j1), done(j2, state="failed")])
    assert counts(backend) == truth(backend)
    backend.counts_fold()
    assert counts(backend) == truth(backend)
    backend.job_retry_many(filter=JobFilter(states="failed"))
    backend.job_cancel_many(filter=JobFilter(ids=[c.id]))
    backend.job_schedule_due(now=later(61))
    assert counts(backend) == truth(backend)
    backend.job_delete_many(filter=JobFilter(states="cancelled"))
    backend.job_prune(state="succeeded", older_than_s=0, now=later(1))
    backend.counts_fold()
    assert counts(backend) == truth(backend)
    [_x] = backend.job_claim(queues=["q"], worker_id="ghost", limit=1)
    backend.job_rescue(worker_ttl_s=1)  # back to available, attempt counted
    assert counts(backend) == truth(backend)
    assert backend.job_count(filter=JobFilter(tasks="x")) == {"available": 2}  # b retried, d due
    assert backend.job_count(filter=JobFilter(queues="r")) == {}


def test_a_count_on_other_fields_can_stop_at_a_cap(backend):
    backend.job_insert_many(jobs=[ins(args=[i], tenant="acme") for i in range(30)])
    assert backend.job_count(filter=JobFilter(tenant="acme")) == {"available": 30}
    assert backend.job_count(filter=JobFilter(tenant="acme"), cap=10) == {"available": 10}


def test_oldest_waiting_per_queue_and_open_batches(backend):
    backend.job_insert_many(jobs=[ins(queue="a"), ins(queue="b", delay_s=60)])
    oldest = backend.queue_oldest_waiting()
    assert set(oldest) == {"a"}  # b's job is not due yet
    assert backend.batch_count_open() == 0
    backend.batch_create(
        name=None, task="t", idempotency_key=None, on_complete_json=None, jobs=[ins()]
    )
    assert backend.batch_count_open() == 1
