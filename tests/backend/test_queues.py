"""QueueStore: pause, concurrency and rate limits, placement, and counts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from conveyor.records import JobFilter

from ..conftest import only_on
from .helpers import done, fetch, ins, raw_connection


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
    got = backend.job_list(filter=JobFilter(states="available"))
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
    assert [j.args for j in fetch(backend, n=10, worker="w1", tags=["gpu"])] == [["gpu"]]
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


def test_queue_list_shows_settings_and_counts(backend):
    backend.job_insert_many(jobs=[ins(queue="a"), ins(queue="a", delay_s=60)])
    backend.queue_set_limit(name="b", max_running=4)
    backend.queue_set_rate(name="b", rate_per_s=2.0, rate_burst=5.0)
    queues = {q.name: q for q in backend.queue_list()}
    assert queues["a"].counts == {"available": 1, "scheduled": 1}
    assert (queues["b"].max_running, queues["b"].rate_per_s, queues["b"].rate_burst) == (
        4,
        2.0,
        5.0,
    )
    assert queues["b"].counts == {} and not queues["b"].paused


def test_counts_are_per_queue_task_and_state(backend):
    backend.job_insert_many(
        jobs=[ins(task="a", queue="x"), ins(task="b", queue="x"), ins(task="a", queue="y")]
    )
    counts = {(c.queue, c.task, c.state): c.count for c in backend.queue_counts()}
    assert counts == {
        ("x", "a", "available"): 1,
        ("x", "b", "available"): 1,
        ("y", "a", "available"): 1,
    }


def test_a_per_key_limit_holds_across_queues(backend):
    key = {"concurrency_key": "user=1", "concurrency_limit": 1}
    backend.job_insert_many(
        jobs=[ins(queue="a")._replace(**key), ins(queue="b")._replace(**key), ins(queue="b")]
    )
    first = fetch(backend, queues=("a",)) + fetch(backend, queues=("b",))
    assert len(first) == 2 and sum(j.concurrency_key == "user=1" for j in first) == 1


@only_on("postgres")  # its queue locks are advisory locks (SQLite has one writer)
def test_limited_queues_claim_without_waiting_on_each_other(backend):
    """PostgreSQL: a limited claim locks its own queue (and keys), not the cluster."""
    import threading
    import time

    backend.job_insert_many(jobs=[ins(queue="a"), ins(queue="b"), ins(queue="b")])
    backend.queue_set_limit(name="a", max_running=5)
    backend.queue_set_limit(name="b", max_running=5)
    with raw_connection(backend) as other:  # holds queue a's claim lock in a transaction
        other.execute("SELECT pg_advisory_xact_lock(72628374, hashtext('a'))")
        claimed_b: list = []
        tb = threading.Thread(target=lambda: claimed_b.extend(fetch(backend, queues=("b",))))
        tb.start()
        tb.join(60)  # a guard against a hang, not a speed check
        assert not tb.is_alive() and len(claimed_b) == 2  # queue b did not wait on a
        claimed_a: list = []  # while a claim in queue a waits for that very lock
        ta = threading.Thread(target=lambda: claimed_a.extend(fetch(backend, queues=("a",))))
        ta.start()
        with raw_connection(backend) as probe:
            waiting = (  # this database's only: other test processes may be running
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            for _ in range(600):
                if probe.execute(waiting).fetchone()[0]:
                    break
                time.sleep(0.1)
            assert probe.execute(waiting).fetchone()[0] == 1 and ta.is_alive()
        other.rollback()
        ta.join(60)
    assert not ta.is_alive() and len(claimed_a) == 1
