"""WorkerStore: heartbeats, the registry, remote stop, leadership; and the notifier."""

from __future__ import annotations

import threading
import time

import pytest

from conveyor.records import JobFilter

from .helpers import done, fetch, ins, later, raw_connection, register


def test_heartbeat_writes_one_row_and_reports_what_the_worker_holds(backend):
    backend.job_insert_many(jobs=[ins(), ins()])
    first = register(backend, "w1")
    assert (first.held, first.cancel, first.stop) == ({}, [], False)
    assert first.schema_version == backend.latest_schema
    a, b = fetch(backend, worker="w1")
    beat = register(backend, "w1")
    assert beat.held == {a.id: a.lease_token, b.id: b.lease_token}
    backend.job_finalize_many(worker_id="w1", outcomes=[done(a)])
    assert register(backend, "w1").held == {b.id: b.lease_token}
    assert [w.id for w in backend.worker_list()] == ["w1"]
    backend.worker_deregister(worker_id="w1")
    assert backend.worker_list() == []


def test_workers_are_listed_a_page_at_a_time_alive_or_silent(backend):
    for wid in ("w3", "w1", "w2", "w10"):
        register(backend, wid)
    register(backend, "w2", now=later(-300))  # silent for five minutes
    assert [w.id for w in backend.worker_list()] == ["w1", "w10", "w2", "w3"]
    assert [w.id for w in backend.worker_list(limit=2)] == ["w1", "w10"]
    assert [w.id for w in backend.worker_list(limit=2, after_id="w10")] == ["w2", "w3"]
    assert backend.worker_list(limit=2, after_id="w3") == []
    assert [w.id for w in backend.worker_list(alive=True, ttl_s=7)] == ["w1", "w10", "w3"]
    assert [w.id for w in backend.worker_list(alive=False, ttl_s=7)] == ["w2"]
    assert [w.id for w in backend.worker_list(alive=True, ttl_s=600)] == ["w1", "w10", "w2", "w3"]


def test_workers_are_counted_alive_and_silent_without_listing_them(backend):
    assert backend.worker_count() == {"alive": 0, "silent": 0}
    for wid in ("w1", "w2", "w3"):
        register(backend, wid)
    register(backend, "w2", now=later(-300))  # silent for five minutes
    assert backend.worker_count(ttl_s=7) == {"alive": 2, "silent": 1}
    assert backend.worker_count(ttl_s=600) == {"alive": 3, "silent": 0}
    assert backend.worker_count(ttl_s=7, now=later(3600)) == {"alive": 0, "silent": 3}


def test_a_forgotten_worker_learns_it_was_judged_dead(backend):
    assert register(backend, "w1").resurrected  # a first beat creates the row
    assert not register(backend, "w1").resurrected
    backend.worker_prune_stale(older_than_s=300, now=later(301))
    assert register(backend, "w1").resurrected


def test_cancel_request_reaches_the_holders_heartbeat(backend):
    backend.job_insert_many(jobs=[ins(), ins()])
    a, b = fetch(backend)
    assert backend.job_cancel_many(filter=JobFilter(ids=[a.id])) == ([], [a.id])
    beat = register(backend, "w1")
    assert sorted(beat.held) == sorted([a.id, b.id]) and beat.cancel == [a.id]
    backend.job_finalize_many(worker_id="w1", outcomes=[done(a, state="cancelled")])
    assert backend.job_cancel_many(filter=JobFilter(ids=[a.id])) == ([], [])  # finished


def test_stop_request_reaches_the_workers_heartbeat(backend):
    register(backend, "w7")
    assert backend.worker_request_stop(worker_id="w7") is True
    assert backend.worker_request_stop(worker_id="nobody") is False
    assert register(backend, "w7").stop is True
    assert backend.worker_list()[0].stop_requested


def test_workers_silent_too_long_are_forgotten(backend):
    register(backend, "old")
    assert backend.worker_prune_stale(older_than_s=300) == 0
    assert backend.worker_prune_stale(older_than_s=300, now=later(301)) == 1
    assert backend.worker_list() == []


def test_leader_lease_has_one_holder_and_is_taken_over_when_it_expires(backend):
    assert backend.leader_attempt_elect(name="flow", holder="a", ttl_s=10) is True
    assert backend.leader_attempt_elect(name="flow", holder="b", ttl_s=10) is False
    assert backend.leader_attempt_elect(name="flow", holder="a", ttl_s=10) is True  # renew
    future = later(11)
    assert backend.leader_attempt_elect(name="flow", holder="b", ttl_s=10, now=future) is True
    assert backend.leader_attempt_elect(name="flow", holder="a", ttl_s=10, now=future) is False
    backend.leader_resign(name="flow", holder="b")
    assert backend.leader_attempt_elect(name="flow", holder="a", ttl_s=10, now=future) is True


def test_racing_candidates_elect_one_leader(backend):
    wins: list[str] = []
    barrier = threading.Barrier(6)

    def run(holder: str) -> None:
        barrier.wait()
        if backend.leader_attempt_elect(name="race", holder=holder, ttl_s=10):
            wins.append(holder)

    threads = [threading.Thread(target=run, args=(f"c{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1


# -- wake-ups -------------------------------------------------------------------------------
def test_notifier_hears_jobs_inserted_by_another_connection(backend, db_url):
    from conveyor.backends import open_backend

    notifier = backend.notifier()
    other = open_backend(db_url)  # its own connections, as another process would have
    timer = threading.Timer(0.3, lambda: other.job_insert_many(jobs=[ins(queue="mail")]))
    try:
        assert notifier.wait(0.2) == set()  # nothing happened: no hint
        timer.start()
        hint = notifier.wait(10)
        assert hint & {"mail", "*"}, "no wake-up arrived for the insert"
    finally:
        timer.cancel()
        if timer.ident is not None:
            timer.join()  # its insert ended: not still running into the next test
        notifier.close()
        other.close()


def test_closing_a_notifier_ends_its_wait_at_once(backend):
    """A worker stops without sitting out its listener's wait (0.5 s a stop on
    PostgreSQL before the wait watched a socket that close() writes to)."""
    notifier = backend.notifier()
    returned: list[float] = []

    def wait() -> None:
        notifier.wait(30)
        returned.append(time.monotonic())

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)  # in its wait
    closed_at = time.monotonic()
    notifier.close()
    waiter.join(10)
    assert returned and returned[0] - closed_at < 5  # not the 30 s it was waiting
    assert notifier.wait(5) == set()  # closed: returns at once, nothing heard


def test_closing_a_notifier_under_its_polls_raises_nothing(backend):
    """A worker stops (closes its notifier) while its wait polls the database:
    the wait ends with nothing heard, never an error. On MySQL the close used to
    close the poll's connection under it: PyMySQL raised AttributeError out of
    wait() in 4 rounds of 200."""
    import random

    errors: list[str] = []
    for _ in range(200):
        notifier = backend.notifier()

        def wait(notifier=notifier) -> None:
            try:
                for _ in range(20):
                    notifier.wait(0.01)
            except Exception as exc:
                errors.append(repr(exc))

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(random.uniform(0.0, 0.02))
        notifier.close()
        waiter.join(10)
        assert not waiter.is_alive()
    assert errors == []


def test_a_notifier_past_descriptor_1023_still_hears_and_closes(backend, db_url):
    """A busy process (a server with many clients) has descriptors past 1023,
    which select() refuses: the notifier's wait must still work there."""
    import os
    import resource

    from conveyor.backends import open_backend

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1300:
        if hard != resource.RLIM_INFINITY and hard < 1300:
            pytest.skip(f"this process may open {hard} files at most")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1300, hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        notifier = backend.notifier()  # its connection and sockets come past 1023
        other = open_backend(db_url)
        try:
            threading.Timer(0.3, lambda: other.job_insert_many(jobs=[ins(queue="mail")])).start()
            assert notifier.wait(10) & {"mail", "*"}, "no wake-up arrived for the insert"
            returned: list[float] = []
            waiter = threading.Thread(target=lambda: returned.append(len(notifier.wait(30))))
            waiter.start()
            time.sleep(0.3)
            closed_at = time.monotonic()
            notifier.close()
            waiter.join(10)
            assert returned and time.monotonic() - closed_at < 5
        finally:
            notifier.close()
            other.close()
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_events_notifier_hears_jobs_finishing(backend):
    notifier = backend.notifier(events=True)
    try:
        backend.job_insert_many(jobs=[ins()])
        [job] = fetch(backend)
        notifier.wait(0.2)  # drain what the insert and claim may have caused
        backend.job_finalize_many(worker_id="w1", outcomes=[done(job)])
        assert notifier.wait(10), "no hint that a job finished"
    finally:
        notifier.close()


def test_no_wake_up_for_a_rolled_back_insert(backend):
    if not backend.supports("push_notifications"):
        pytest.skip("polling dialects hint 'something changed'; a rollback changes nothing")
    notifier = backend.notifier()
    conn = raw_connection(backend)
    try:
        backend.job_insert_many(jobs=[ins(queue="mail")], conn=conn)
        conn.rollback()
        assert notifier.wait(0.5) == set()
    finally:
        conn.close()
        notifier.close()


def test_a_workers_own_outcomes_wake_other_workers_but_not_itself(backend):
    """An outcome that makes work (here a job moving to its next stage) hints its
    queue to every worker but the one that wrote it, which claims again after each
    write of its outcomes anyway: hearing it too made a second claim on the same
    news, which under a full queue limit found nothing (a third of the claims of a
    drain under max_running=50)."""
    if not backend.supports("push_notifications"):
        pytest.skip("polling dialects also hint 'something changed' (*): every worker wakes")
    from conveyor.records import Finalize
    from conveyor.runtime.listener import Listener

    woken = {"w1": threading.Event(), "w2": threading.Event()}
    listeners = [
        Listener(
            backend.notifier,
            ["q"],
            on_work=woken[me].set,
            on_flow=lambda: None,
            on_cancel=lambda: None,
            me=me,
        )
        for me in ("w1", "w2")
    ]
    for listener in listeners:
        listener.start()
    try:
        backend.job_insert_many(jobs=[ins()])
        assert woken["w1"].wait(10) and woken["w2"].wait(10)  # a plain insert: both
        [job] = fetch(backend, worker="w1")
        time.sleep(0.3)  # let the insert's hints arrive before listening again
        for event in woken.values():
            event.clear()
        stage = Finalize(job.id, job.lease_token, "available", "stage", next_stage="two")
        assert backend.job_finalize_many(worker_id="w1", outcomes=[stage]) == [job.id]
        assert woken["w2"].wait(10), "the other worker heard nothing"
        time.sleep(0.3)
        assert not woken["w1"].is_set(), "the writer woke on its own outcome's hint"
    finally:
        for listener in listeners:
            listener.stop()
