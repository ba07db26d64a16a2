"""Conformance of queue control, cancellation, remote stop, snooze, aging, retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from conveyor.backends.base import Finalize, Lease

from .test_conformance import _worker, done, fetch, ins, later


def test_paused_queue_is_not_claimed_until_resumed(backend):
    backend.job_insert_many(jobs=[ins(queue="a"), ins(queue="b")])
    backend.queue_set_paused(name="a", paused=True)
    assert [j.queue for j in fetch(backend, queues=("a", "b"))] == ["b"]
    assert fetch(backend, queues=("a",)) == []
    queues = {q.name: q for q in backend.queue_list()}
    assert queues["a"].paused and not queues["b"].paused
    assert queues["a"].counts == {"available": 1} and queues["b"].counts == {"running": 1}
    backend.queue_set_paused(name="a", paused=False)
    assert [j.queue for j in fetch(backend, queues=("a",))] == ["a"]


def test_pausing_a_queue_with_no_jobs_is_listed(backend):
    backend.queue_set_paused(name="empty", paused=True)
    assert [(q.name, q.paused, q.counts) for q in backend.queue_list()] == [("empty", True, {})]


def test_cancel_request_reaches_the_holders_heartbeat(backend):
    backend.job_insert_many(jobs=[ins(), ins()])
    a, b = fetch(backend)
    assert backend.job_request_cancel(job_id=a.id) is True
    beat = backend.worker_heartbeat(
        worker=_worker(),
        lease_s=30,
        leases=[Lease(a.id, a.lease_token), Lease(b.id, b.lease_token)],
    )
    assert sorted(beat.held) == sorted([a.id, b.id]) and beat.cancel == [a.id]
    backend.job_finalize_many(worker_id="w1", outcomes=[done(a, state="cancelled")])
    assert backend.job_request_cancel(job_id=a.id) is False  # finished: nothing to cancel
    [res] = backend.job_insert_many(jobs=[ins(delay_s=60)])
    assert backend.job_request_cancel(job_id=res.id) is False  # not running: use job_cancel


def test_stop_request_reaches_the_workers_heartbeat(backend):
    backend.worker_heartbeat(worker=_worker("w7"), leases=[], lease_s=30)
    assert backend.worker_request_stop(worker_id="w7") is True
    assert backend.worker_request_stop(worker_id="nobody") is False
    assert backend.worker_heartbeat(worker=_worker("w7"), leases=[], lease_s=30).stop is True


def test_snooze_reschedules_without_using_an_attempt(backend):
    [res] = backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend)
    snooze = Finalize(job.id, job.lease_token, "scheduled", "snoozed", retry_in_s=30)
    assert backend.job_finalize_many(worker_id="w1", outcomes=[snooze]) == [res.id]
    got = backend.job_get(job_id=res.id)
    assert (got.state, got.attempts) == ("scheduled", 0)
    assert got.scheduled_at > datetime.now(UTC) + timedelta(seconds=20)
    assert [a.outcome for a in backend.job_attempts(job_id=res.id)] == ["snoozed"]


def test_aging_raises_waiting_jobs_priority_up_to_the_cap(backend):
    old, _fresh = backend.job_insert_many(jobs=[ins(priority=1), ins(priority=1)])
    backend.job_insert_many(jobs=[ins(priority=5)])
    # 3.5 aging periods later (time passed in), the first two have aged 3 points
    assert backend.job_age_priorities(aging_s=10, max_boost=10, now=later(35)) == 3
    assert backend.job_get(job_id=old.id).priority == 4
    assert backend.job_age_priorities(aging_s=10, max_boost=10, now=later(35)) == 0  # idempotent
    assert backend.job_age_priorities(aging_s=10, max_boost=6, now=later(1000)) == 3
    got = backend.job_get(job_id=old.id)
    assert got.priority == 7  # 1 + the cap of 6
    # the priority-5 job reached 11: base 5 + 6; order is by effective priority
    order = [j.priority for j in fetch(backend, n=3, now=later(1000))]
    assert order == [11, 7, 7]


def test_prune_removes_old_finished_jobs_with_their_attempts(backend):
    backend.job_insert_many(jobs=[ins() for _ in range(3)])
    a, b, c = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(a), done(b), done(c, state="failed")])
    assert backend.job_prune(state="succeeded", older_than_s=60, now=later(30)) == 0
    assert backend.job_prune(state="succeeded", older_than_s=60, dry_run=True, now=later(61)) == 2
    assert backend.job_get(job_id=a.id) is not None  # dry run deleted nothing
    assert backend.job_prune(state="succeeded", older_than_s=60, limit=1, now=later(61)) == 1
    assert backend.job_prune(state="succeeded", older_than_s=60, now=later(61)) == 1
    assert backend.job_get(job_id=a.id) is None and backend.job_attempts(job_id=a.id) == []
    assert backend.job_get(job_id=c.id).state == "failed"  # other states keep their own age


def test_prune_keeps_jobs_of_open_batches(backend):
    batch_id, _ = backend.batch_create(
        name=None, task="t", idempotency_key=None, on_complete_json=None, jobs=[ins(), ins()]
    )
    a, _b = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(a)])
    assert backend.job_prune(state="succeeded", older_than_s=1, now=later(60)) == 0
    assert backend.batch_progress(batch_id=batch_id) == {"succeeded": 1, "running": 1}


def test_claims_respect_per_key_limits(backend):
    jobs = [ins(args=[i])._replace(concurrency_key="user=1", concurrency_limit=2) for i in range(5)]
    jobs += [ins(args=[9])._replace(concurrency_key="user=2", concurrency_limit=2)]
    backend.job_insert_many(jobs=jobs)
    first = fetch(backend, n=10)
    assert sorted(j.args[0] for j in first) == [0, 1, 9]  # two of user 1, one of user 2
    assert fetch(backend, n=10) == []  # user 1 is full
    backend.job_finalize_many(worker_id="w1", outcomes=[done(first[0])])
    assert len(fetch(backend, n=10)) == 1


def test_claims_respect_a_queue_wide_limit(backend):
    backend.job_insert_many(jobs=[ins() for _ in range(10)])
    backend.queue_set_limit(name="q", max_running=3)
    assert len(fetch(backend, n=10)) == 3
    assert fetch(backend, n=10) == []
    assert [q.max_running for q in backend.queue_list() if q.name == "q"] == [3]
    backend.queue_set_limit(name="q", max_running=None)
    assert len(fetch(backend, n=10)) == 7


def _rated(i, key="k", rate=1.0, burst=3.0):
    return ins(args=[i])._replace(rate_key=key, rate_per_s=rate, rate_burst=burst)


def test_rate_limited_claims_take_tokens_from_a_shared_bucket(backend):
    backend.job_insert_many(jobs=[_rated(i) for i in range(10)])
    t0 = datetime.now(UTC)
    assert len(fetch(backend, n=10, now=t0)) == 3  # a full bucket: the burst
    assert fetch(backend, n=10, now=t0 + timedelta(seconds=0.5)) == []  # half a token
    assert len(fetch(backend, n=10, now=t0 + timedelta(seconds=2.1))) == 2  # refilled 2.1
    assert len(fetch(backend, n=10, now=t0 + timedelta(seconds=60))) == 3  # capped at burst
    got = backend.job_list(state="available")
    assert len(got) == 2 and all(j.attempts == 0 for j in got)  # waiting uses no attempt


def test_each_rate_key_has_its_own_bucket(backend):
    backend.job_insert_many(jobs=[_rated(i, key=f"u{i % 2}", burst=1) for i in range(6)])
    t0 = datetime.now(UTC)
    claimed = fetch(backend, n=10, now=t0)
    assert sorted(j.args[0] % 2 for j in claimed) == [0, 1]


def test_pinned_jobs_go_only_to_matching_workers(backend):
    backend.job_insert_many(
        jobs=[
            ins(args=["gpu"])._replace(pinned_to='["gpu"]'),
            ins(args=["w2"])._replace(pinned_to='["w2"]'),
            ins(args=["any"]),
        ]
    )
    assert [j.args for j in fetch(backend, n=10, worker="w1")] == [["any"]]
    assert [
        j.args
        for j in backend.job_fetch_available(
            queues=["q"], worker_id="w1", limit=10, lease_s=30, tags=["gpu"]
        )
    ] == [["gpu"]]
    assert [j.args for j in fetch(backend, n=10, worker="w2")] == [["w2"]]


def test_spread_jobs_each_go_to_a_different_worker(backend):
    backend.job_insert_many(jobs=[ins(args=[i])._replace(spread_group="g") for i in range(3)])
    first = fetch(backend, n=10, worker="w1")
    assert len(first) == 1  # one of the group per worker
    assert fetch(backend, n=10, worker="w1") == []  # w1 holds one already
    backend.job_finalize_many(worker_id="w1", outcomes=[done(first[0])])
    assert fetch(backend, n=10, worker="w1") == []  # and has run one
    assert len(fetch(backend, n=10, worker="w2")) == 1
    assert len(fetch(backend, n=10, worker="w3")) == 1


def test_limited_jobs_created_in_a_batch_are_claimable(backend):
    backend.batch_create(
        name=None,
        task="t",
        idempotency_key=None,
        on_complete_json=None,
        jobs=[
            ins(args=[i])._replace(spread_group="g", rate_key="r", rate_per_s=5.0, rate_burst=5.0)
            for i in range(2)
        ],
    )
    assert len(fetch(backend, n=10, worker="w1")) == 1
    assert len(fetch(backend, n=10, worker="w2")) == 1


def test_a_queue_rate_limit_caps_claims_for_the_whole_queue(backend):
    backend.job_insert_many(jobs=[ins(args=[i]) for i in range(10)])
    backend.queue_set_rate(name="q", rate_per_s=1.0, rate_burst=3.0)
    t0 = datetime.now(UTC)
    assert len(fetch(backend, n=10, now=t0)) == 3  # the burst
    assert fetch(backend, n=10, now=t0 + timedelta(seconds=0.5)) == []
    assert len(fetch(backend, n=10, now=t0 + timedelta(seconds=2.1))) == 2
    backend.queue_set_rate(name="q", rate_per_s=None, rate_burst=None)
    assert len(fetch(backend, n=10, now=t0 + timedelta(seconds=2.2))) == 5  # limit lifted
