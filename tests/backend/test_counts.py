"""Counts from the rollup the database keeps (no scan): exact after every kind of
change, before and after the leader folds the deltas."""

from __future__ import annotations

import re
from datetime import timedelta

from conveyor.records import JobFilter

from ..conftest import only_on
from .helpers import backend_at_schema, done, fetch, ins, later, raw_connection


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


def test_oldest_waiting_is_the_first_due_job_of_any_priority(backend):
    """The oldest waiting job may sit at any priority; a due scheduled job waits
    too, a future one does not."""
    t0 = later(-1000)

    def at(s: float):
        return t0 + timedelta(seconds=s)

    backend.job_insert_many(jobs=[ins(queue="q", priority=5)], now=at(10))
    backend.job_insert_many(jobs=[ins(queue="q", priority=0)], now=at(0))  # oldest, lowest
    backend.job_insert_many(jobs=[ins(queue="q", priority=9, delay_s=50)], now=at(-20))
    backend.job_insert_many(jobs=[ins(queue="q", priority=3, delay_s=500)], now=at(0))
    backend.job_insert_many(jobs=[ins(queue="r", priority=1, delay_s=900)], now=at(0))
    backend.counts_fold()

    def oldest(s: float) -> dict:
        return {
            q: round((t - t0).total_seconds(), 2)
            for q, t in backend.queue_oldest_waiting(now=at(s)).items()
        }

    assert oldest(20) == {"q": 0.0}
    assert oldest(40) == {"q": 0.0}  # the priority-9 job is due from 30: not older
    [c, a] = fetch(backend, 2, now=at(40))  # highest priority first: 9, then 5
    assert (c.priority, a.priority) == (9, 5)
    assert oldest(40) == {"q": 0.0}
    [b] = fetch(backend, 1, now=at(40))
    assert b.priority == 0
    assert oldest(40) == {}  # left: the priority-3 job, due at 500, and r's at 900
    assert oldest(600) == {"q": 500.0}
    assert oldest(950) == {"q": 500.0, "r": 900.0}


def batch_truth(backend, batch_id: int) -> dict:
    out: dict = {}
    for j in backend.batch_jobs(batch_id=batch_id):
        out[str(j.state)] = out.get(str(j.state), 0) + 1
    return out


def new_batch(backend, n: int) -> int:
    batch_id, _ = backend.batch_create(
        name=None,
        task="t",
        idempotency_key=None,
        on_complete_json=None,
        jobs=[ins(args=[i]) for i in range(n)],
    )
    return batch_id


def test_batch_progress_follows_every_change_exactly(backend):
    """batch_progress reads a rollup the database keeps (schema v16), not the jobs:
    it must agree with them after every kind of change, folded or not."""
    b = new_batch(backend, 6)
    other = new_batch(backend, 2)
    backend.job_insert_many(jobs=[ins(args=["not in a batch"])])

    def agree() -> dict:
        for batch_id in (b, other):
            assert backend.batch_progress(batch_id=batch_id) == batch_truth(backend, batch_id)
        return backend.batch_progress(batch_id=b)

    assert agree() == {"available": 6}
    j1, j2, _j3 = fetch(backend, n=3)
    assert agree() == {"available": 3, "running": 3}
    backend.job_finalize_many(worker_id="w1", outcomes=[done(j1), done(j2, state="failed")])
    assert agree() == {"available": 3, "running": 1, "succeeded": 1, "failed": 1}
    backend.counts_fold()
    assert agree() == {"available": 3, "running": 1, "succeeded": 1, "failed": 1}
    backend.job_retry_many(filter=JobFilter(states="failed"))
    backend.job_rescue(worker_ttl_s=1, now=later(3600))  # j3's worker never heartbeat
    agree()
    backend.batch_cancel(batch_id=b)
    assert set(agree()) <= {"cancelled", "succeeded", "running"}
    backend.job_delete_many(filter=JobFilter(states="cancelled"))
    agree()
    backend.counts_fold()
    assert agree() == batch_truth(backend, b)
    assert backend.batch_progress(batch_id=other) == {"available": 2}
    assert backend.batch_progress(batch_id=10_000) == {}


def test_batch_counts_start_from_the_jobs_when_the_schema_is_upgraded(db_url, monkeypatch):
    """Migration 16 takes the counts of batches that already exist."""
    with backend_at_schema(db_url, monkeypatch, 15) as (old, upgrade):
        assert old.schema_version() == 15
        # today's batch_insert writes a column of v21 (fingerprint): as v15 took it
        sql = re.sub(r",\s*fingerprint\b", "", old.Q["batch_insert"])
        sql = re.sub(r",\s*(:fingerprint|%\(fingerprint\)s)", "", sql)
        monkeypatch.setattr(old, "Q", {**old.Q, "batch_insert": sql})
        b = new_batch(old, 5)
        # Changed by hand, as a worker of then did (this code's claims need the
        # latest schema on MySQL, whose job table is partitioned at v22).
        with raw_connection(old) as c:
            ids = sorted(r[0] for r in c.execute(
                f"SELECT id FROM conveyor_jobs WHERE batch_id = {int(b)}"
            ).fetchall())  # fmt: skip
            c.execute(f"UPDATE conveyor_jobs SET state = 'running' WHERE id = {ids[1]}")
            c.execute(
                "UPDATE conveyor_jobs SET state = 'succeeded', finished_at = created_at "
                f"WHERE id = {ids[0]}"
            )
        assert upgrade(16) == [16]
        assert old.batch_progress(batch_id=b) == {"available": 3, "running": 1, "succeeded": 1}
        with raw_connection(old) as c:
            c.execute(
                "UPDATE conveyor_jobs SET state = 'failed', finished_at = created_at "
                f"WHERE id = {ids[1]}"
            )
        assert old.batch_progress(batch_id=b) == batch_truth(old, b)
        assert old.batch_progress(batch_id=b) == {"available": 3, "failed": 1, "succeeded": 1}


@only_on("mysql")  # the only dialect whose leader folds delta rows (row triggers)
def test_a_fold_waits_for_the_deltas_of_a_transaction_still_open(backend):
    """Deltas are folded in the database up to an id read from committed rows;
    a lower one of a transaction still open must be waited for and folded once,
    never deleted unfolded (a read that skipped it, then a delete that waited for
    it, lost it) nor left behind."""
    import threading
    import time

    [moved, _] = backend.job_insert_many(jobs=[ins(args=[1]), ins(args=[2])])
    backend.counts_fold()
    conn = raw_connection(backend)
    try:
        conn.begin()
        conn.execute("UPDATE conveyor_jobs SET queue = 'moved' WHERE id = ?", (moved.id,))
        backend.job_insert_many(jobs=[ins(args=[3])])  # a higher id, committed
        folder = threading.Thread(target=backend.counts_fold)
        folder.start()
        time.sleep(0.5)
        assert folder.is_alive(), "the fold did not wait for the open transaction's deltas"
        conn.commit()
        folder.join(30)
        assert not folder.is_alive()
    finally:
        conn.close()
    assert (
        counts(backend)
        == truth(backend)
        == {("q", "t", "available"): 2, ("moved", "t", "available"): 1}
    )
    with raw_connection(backend) as c:
        assert c.execute("SELECT count(*) FROM conveyor_count_deltas").fetchone()[0] == 0
