"""The backend conformance suite: every verb of the seam, on every dialect.

Time is passed in (``now``) wherever a verb depends on it, so expiry and
scheduling are exercised without sleeping.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from conveyor.backends import base
from conveyor.backends.base import Finalize, JobInsert, Lease, WorkerInfo
from conveyor.errors import SchemaError


def ins(task: str = "t", queue: str = "q", **kw) -> JobInsert:
    args = kw.pop("args", [])
    return JobInsert(
        queue=queue, task=task, args_json=json.dumps({"args": args, "kwargs": {}}), **kw
    )


def fetch(backend, n: int = 10, queues=("q",), worker: str = "w1", lease_s: float = 30, now=None):
    return backend.job_fetch_available(
        queues=list(queues), worker_id=worker, limit=n, lease_s=lease_s, now=now
    )


def done(job, state: str = "succeeded", token: str | None = None, **kw) -> Finalize:
    return Finalize(
        job_id=job.id,
        token=token if token is not None else job.lease_token,
        state=state,
        outcome=kw.pop("outcome", state),
        **kw,
    )


def later(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


# -- schema -----------------------------------------------------------------------------
def test_migrate_is_idempotent(backend):
    assert backend.migrate() == []
    assert backend.schema_version() >= 1


def test_schema_newer_than_code_is_refused(backend, monkeypatch):
    module = __import__(type(backend).__module__, fromlist=["MIGRATIONS"])
    monkeypatch.setattr(module, "MIGRATIONS", module.MIGRATIONS[:0])
    with pytest.raises(SchemaError, match="upgrade the conveyor package"):
        backend.migrate()


# -- inserting --------------------------------------------------------------------------
def test_insert_then_get_round_trips(backend):
    [res] = backend.job_insert_many(
        jobs=[
            ins(
                args=[1, "x"], priority=3, max_attempts=7, timeout_s=2.5, backoff_json='{"base": 1}'
            )
        ]
    )
    assert res.created
    job = backend.job_get(job_id=res.id)
    assert (job.task, job.queue, job.args, job.state) == ("t", "q", [1, "x"], "available")
    assert (job.priority, job.max_attempts, job.timeout, job.attempts) == (3, 7, 2.5, 0)
    assert job.backoff == {"base": 1}
    assert backend.job_get(job_id=res.id + 1000) is None


def test_insert_many_returns_ids_in_input_order(backend):
    results = backend.job_insert_many(jobs=[ins(args=[i]) for i in range(50)])
    assert [backend.job_get(job_id=r.id).args for r in results] == [[i] for i in range(50)]


def test_delayed_job_is_scheduled_and_claimable_only_when_due(backend):
    [res] = backend.job_insert_many(jobs=[ins(delay_s=60)])
    assert backend.job_get(job_id=res.id).state == "scheduled"
    assert fetch(backend) == []
    assert [j.id for j in fetch(backend, now=later(61))] == [res.id]


def test_unique_key_allows_one_unfinished_job(backend):
    first, again = backend.job_insert_many(jobs=[ins(unique_key="k"), ins(unique_key="k")])
    assert first.created and not again.created and again.id == first.id
    [job] = fetch(backend)
    assert backend.job_insert_many(jobs=[ins(unique_key="k")])[0].id == first.id  # running
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job)])
    fresh = backend.job_insert_many(jobs=[ins(unique_key="k")])[0]
    assert fresh.created and fresh.id != first.id


def test_idempotency_key_returns_the_same_job_forever(backend):
    [first] = backend.job_insert_many(jobs=[ins(idempotency_key="req-1")])
    [job] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job)])
    [again] = backend.job_insert_many(jobs=[ins(idempotency_key="req-1"), ins()])[:1]
    assert (again.id, again.created) == (first.id, False)


def test_racing_inserts_of_one_key_make_one_job(backend):
    results: list = []
    barrier = threading.Barrier(8)

    def race() -> None:
        barrier.wait()
        results.extend(backend.job_insert_many(jobs=[ins(idempotency_key="race")]))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.id for r in results}) == 1
    assert sum(r.created for r in results) == 1


def _raw_connection(backend):
    if backend.name == "postgres":
        return psycopg.connect(backend.url)
    return sqlite3.connect(backend.path)


def test_insert_joins_the_callers_transaction(backend):
    conn = _raw_connection(backend)
    try:
        [rolled] = backend.job_insert_many(jobs=[ins(args=["rolled back"])], conn=conn)
        conn.rollback()
        assert backend.job_get(job_id=rolled.id) is None
        [kept] = backend.job_insert_many(jobs=[ins(args=["committed"])], conn=conn)
        conn.commit()
        assert backend.job_get(job_id=kept.id).args == ["committed"]
    finally:
        conn.close()


# -- claiming ---------------------------------------------------------------------------
def test_fetch_leases_and_counts_an_attempt(backend):
    backend.job_insert_many(jobs=[ins() for _ in range(3)])
    jobs = fetch(backend, n=2, worker="w9", lease_s=30)
    assert len(jobs) == 2
    for j in jobs:
        assert (j.state, j.attempts, j.lease_owner) == ("running", 1, "w9")
        assert j.lease_token and j.lease_expires_at > datetime.now(UTC) + timedelta(seconds=20)
    assert len({j.lease_token for j in jobs}) == 2
    assert len(fetch(backend, n=10)) == 1
    assert fetch(backend) == []


def test_fetch_orders_by_priority_then_age(backend):
    low, high, high2, mid = backend.job_insert_many(
        jobs=[ins(priority=0), ins(priority=10), ins(priority=10), ins(priority=5)]
    )
    order = [j.id for j in fetch(backend, n=10)]
    assert order == [high.id, high2.id, mid.id, low.id]


def test_fetch_only_from_given_queues(backend):
    a, b, _ = backend.job_insert_many(jobs=[ins(queue="a"), ins(queue="b"), ins(queue="c")])
    assert {j.id for j in fetch(backend, queues=("a", "b"))} == {a.id, b.id}


def test_concurrent_claims_never_overlap(backend):
    backend.job_insert_many(jobs=[ins(args=[i]) for i in range(300)])
    claimed: list[int] = []
    lock = threading.Lock()

    def claim(worker: str) -> None:
        while jobs := fetch(backend, n=7, worker=worker):
            with lock:
                claimed.extend(j.id for j in jobs)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claimed) == 300 and len(set(claimed)) == 300


# -- finishing and fencing ----------------------------------------------------------------
def test_finalize_records_result_and_attempt(backend):
    backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend)
    assert backend.job_finalize_many(
        worker_id="w1", outcomes=[done(job, result_json='{"ok": 1}')]
    ) == [job.id]
    got = backend.job_get(job_id=job.id)
    assert (got.state, got.result, got.lease_token) == ("succeeded", {"ok": 1}, None)
    assert got.finished_at is not None
    [attempt] = backend.job_attempts(job_id=job.id)
    assert (attempt.attempt, attempt.outcome, attempt.worker_id) == (1, "succeeded", "w1")
    assert attempt.duration_s is not None and attempt.duration_s >= 0


def test_finalize_with_a_stale_token_changes_nothing(backend):
    backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend)
    assert (
        backend.job_finalize_many(worker_id="w1", outcomes=[done(job, token="not-the-token")]) == []
    )
    assert backend.job_get(job_id=job.id).state == "running"
    assert backend.job_finalize_many(worker_id="w1", outcomes=[done(job)]) == [job.id]
    # a duplicate completion is refused: never counted succeeded twice
    assert backend.job_finalize_many(worker_id="w1", outcomes=[done(job)]) == []
    assert [a.outcome for a in backend.job_attempts(job_id=job.id)] == ["succeeded"]


def test_finalize_retry_schedules_with_delay(backend):
    backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend)
    backend.job_finalize_many(
        worker_id="w1",
        outcomes=[
            done(job, state="scheduled", outcome="retry", error="ValueError: x", retry_in_s=30)
        ],
    )
    got = backend.job_get(job_id=job.id)
    assert (got.state, got.error, got.attempts) == ("scheduled", "ValueError: x", 1)
    assert got.scheduled_at > datetime.now(UTC) + timedelta(seconds=20)
    assert fetch(backend) == []
    [again] = fetch(backend, now=later(31))
    assert again.attempts == 2


def test_finalize_batch_applies_each_outcome(backend):
    backend.job_insert_many(jobs=[ins() for _ in range(3)])
    a, b, c = fetch(backend)
    accepted = backend.job_finalize_many(
        worker_id="w1",
        outcomes=[
            done(a),
            done(b, state="failed", error="boom", traceback="tb"),
            done(c, token="stale"),
        ],
    )
    assert sorted(accepted) == sorted([a.id, b.id])
    assert backend.job_get(job_id=b.id).error == "boom"
    assert backend.job_attempts(job_id=b.id)[0].traceback == "tb"
    assert backend.job_get(job_id=c.id).state == "running"


def test_release_returns_job_without_consuming_an_attempt(backend):
    backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend)
    assert backend.job_release_many(leases=[Lease(job.id, "stale")]) == []
    assert backend.job_release_many(leases=[Lease(job.id, job.lease_token)]) == [job.id]
    got = backend.job_get(job_id=job.id)
    assert (got.state, got.attempts, got.lease_owner) == ("available", 0, None)
    assert (
        backend.job_finalize_many(worker_id="w1", outcomes=[done(job)]) == []
    )  # released lease is dead


# -- leases -------------------------------------------------------------------------------
def _worker(wid: str = "w1") -> WorkerInfo:
    return WorkerInfo(id=wid, hostname="h", pid=1, queues=["q"], concurrency=4)


def test_heartbeat_extends_held_leases_only(backend):
    backend.job_insert_many(jobs=[ins(), ins()])
    a, b = fetch(backend, lease_s=5)
    held = backend.worker_heartbeat(
        worker=_worker(), lease_s=120, leases=[Lease(a.id, a.lease_token), Lease(b.id, "stale")]
    )
    assert held.held == [a.id] and held.cancel == [] and held.stop is False
    assert backend.job_get(job_id=a.id).lease_expires_at > datetime.now(UTC) + timedelta(
        seconds=100
    )
    assert backend.job_get(job_id=b.id).lease_expires_at < datetime.now(UTC) + timedelta(seconds=10)
    assert [w.id for w in backend.worker_list()] == ["w1"]
    backend.worker_deregister(worker_id="w1")
    assert backend.worker_list() == []


def test_workers_silent_too_long_are_forgotten(backend):
    backend.worker_heartbeat(worker=_worker("old"), leases=[], lease_s=30)
    assert backend.worker_prune_stale(older_than_s=300) == 0
    assert backend.worker_prune_stale(older_than_s=300, now=later(301)) == 1
    assert backend.worker_list() == []


def test_rescue_requeues_expired_leases_counting_the_attempt(backend):
    backend.job_insert_many(jobs=[ins(max_attempts=3)])
    [job] = fetch(backend, lease_s=10)
    assert backend.job_rescue_expired(now=later(5)) == base.RescueResult()
    result = backend.job_rescue_expired(now=later(11))
    assert result.requeued == [job.id] and result.failed == []
    got = backend.job_get(job_id=job.id)
    assert (got.state, got.attempts, got.lease_token) == ("available", 1, None)
    assert "lease lost on attempt 1 of 3" in got.error
    [lost] = backend.job_attempts(job_id=job.id)
    assert (lost.outcome, lost.worker_id) == ("lost", "w1")
    # the old holder is fenced out: its completion and heartbeat are refused
    assert backend.job_finalize_many(worker_id="w1", outcomes=[done(job)]) == []
    beat = backend.worker_heartbeat(
        worker=_worker(), lease_s=30, leases=[Lease(job.id, job.lease_token)]
    )
    assert beat.held == []


def test_rescue_fails_a_job_that_lost_its_lease_on_the_last_attempt(backend):
    backend.job_insert_many(jobs=[ins(max_attempts=2)])
    for attempt in (1, 2):
        [job] = fetch(backend, lease_s=1, now=later(10 * attempt))
        assert job.attempts == attempt
        backend.job_rescue_expired(now=later(10 * attempt + 2))
    got = backend.job_get(job_id=job.id)
    assert got.state == "failed"
    assert "no attempts left" in got.error and "lease lost on attempt 2 of 2" in got.error
    assert [a.outcome for a in backend.job_attempts(job_id=job.id)] == ["lost", "lost"]


def test_schedule_due_promotes_scheduled_jobs(backend):
    [res] = backend.job_insert_many(jobs=[ins(delay_s=30)])
    assert backend.job_schedule_due() == 0
    assert backend.job_schedule_due(now=later(31)) == 1
    assert backend.job_get(job_id=res.id).state == "available"


# -- operator actions and inspection -------------------------------------------------------
def test_cancel_only_jobs_not_started(backend):
    a, b = backend.job_insert_many(jobs=[ins(), ins(delay_s=60)])
    [running] = fetch(backend, n=1)
    assert running.id == a.id
    assert backend.job_cancel(job_id=a.id) is False
    assert backend.job_cancel(job_id=b.id) is True
    assert backend.job_get(job_id=b.id).state == "cancelled"


def test_retry_gives_a_failed_job_another_attempt(backend):
    backend.job_insert_many(jobs=[ins(max_attempts=1)])
    [job] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job, state="failed", error="x")])
    assert backend.job_retry(job_id=job.id) is True
    got = backend.job_get(job_id=job.id)
    assert (got.state, got.max_attempts) == ("available", 2)
    assert backend.job_retry(job_id=job.id) is False  # not failed any more


def test_list_filters_and_counts(backend):
    backend.job_insert_many(
        jobs=[ins(task="a", queue="x"), ins(task="b", queue="x"), ins(task="a", queue="y")]
    )
    assert [j.task for j in backend.job_list(task="a")] == ["a", "a"]
    assert len(backend.job_list(queue="x")) == 2
    newest = backend.job_list(limit=1)[0]
    assert len(backend.job_list(before_id=newest.id)) == 2
    counts = {(c.queue, c.state): c.count for c in backend.queue_counts()}
    assert counts == {("x", "available"): 2, ("y", "available"): 1}


# -- wake-ups -------------------------------------------------------------------------------
def test_notifier_hears_jobs_inserted_by_another_connection(backend, db_url):
    from conveyor.backends import open_backend

    notifier = backend.notifier()
    other = open_backend(db_url)  # its own connections, as another process would have
    try:
        assert notifier.wait(0.2) == set()  # nothing happened: no hint
        threading.Timer(0.3, lambda: other.job_insert_many(jobs=[ins(queue="mail")])).start()
        hint = notifier.wait(10)
        assert hint & {"mail", "*"}, "no wake-up arrived for the insert"
    finally:
        notifier.close()
        other.close()


def test_no_wake_up_for_a_rolled_back_insert(backend):
    if backend.name != "postgres":
        pytest.skip("SQLite hints are 'the file changed'; a rollback changes nothing to hint at")
    notifier = backend.notifier()
    conn = _raw_connection(backend)
    try:
        backend.job_insert_many(jobs=[ins(queue="mail")], conn=conn)
        conn.rollback()
        assert notifier.wait(0.5) == set()
    finally:
        conn.close()
        notifier.close()
