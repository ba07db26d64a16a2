"""DurableStore: a job's durable steps (written fenced by the lease token, first
write wins), sleeps and waits with their times stored once, events (first payload
wins) and the wake-up of their waiters, closing the race of an emit with a
waiter's outcome; steps go with their job."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from conveyor.records import JobFilter, Lease
from conveyor.runtime.maintenance import Maintenance

from .helpers import done, fetch, ins, register


def _running(backend, **kw):
    backend.job_insert_many(jobs=[ins(**kw)])
    [job] = fetch(backend)
    return job


def test_a_step_is_stored_once_and_read_back(backend):
    job = _running(backend)
    first = backend.step_save(
        job_id=job.id, token=job.lease_token, name="a", kind="step", result_json='{"x": 1}'
    )
    assert (first.kind, json.loads(first.result_json), first.done) == ("step", {"x": 1}, True)
    again = backend.step_save(
        job_id=job.id, token=job.lease_token, name="a", kind="step", result_json='"other"'
    )
    assert json.loads(again.result_json) == {"x": 1}  # the first write wins
    backend.step_save(job_id=job.id, token=job.lease_token, name="b", kind="step", result_json="2")
    assert [(s.name, s.result_json) for s in backend.step_list(job_id=job.id)] == [
        ("a", '{"x": 1}'),
        ("b", "2"),
    ]


def test_a_step_write_of_a_stale_attempt_is_refused(backend):
    register(backend, "w1")
    job = _running(backend)
    stale = job.lease_token
    assert backend.step_save(job_id=job.id, token="not-the-token", name="a", kind="step") is None
    # the attempt is given back (graceful shutdown); the next attempt holds the job
    backend.job_release_many(worker_id="w1", leases=[Lease(job.id, stale)])
    [again] = fetch(backend)
    assert again.id == job.id and again.lease_token != stale
    stored = dict(job_id=job.id, name="a", kind="step", result_json='"stale"')
    assert backend.step_save(token=stale, **stored) is None
    wait = dict(job_id=job.id, name="w", key="k", timeout_s=60)
    assert backend.step_wait(token=stale, **wait) is None
    assert backend.step_list(job_id=job.id) == []
    fresh = backend.step_save(token=again.lease_token, **{**stored, "result_json": '"fresh"'})
    assert json.loads(fresh.result_json) == "fresh"
    # once the attempt has ended, its token writes nothing either
    backend.job_finalize_many(worker_id="w1", outcomes=[done(again)])
    late = backend.step_save(token=again.lease_token, **{**stored, "name": "late"})
    assert late is None
    assert [s.name for s in backend.step_list(job_id=job.id)] == ["a"]


def test_a_sleep_stores_its_end_once(backend):
    job = _running(backend)
    t0 = datetime.now(UTC)
    sleep = dict(job_id=job.id, token=job.lease_token, name="nap", kind="sleep")
    first = backend.step_save(wake_in_s=100.0, now=t0, **sleep)
    assert first.kind == "sleep" and abs(first.due_in_s - 100) < 0.01
    # asked again 30 s on (a rerun before it ended): the remainder, not 100 s more
    again = backend.step_save(wake_in_s=100.0, now=t0 + timedelta(seconds=30), **sleep)
    assert abs(again.due_in_s - 70) < 0.01
    after = backend.step_save(wake_in_s=100.0, now=t0 + timedelta(seconds=101), **sleep)
    assert after.due_in_s < 0


def test_a_wait_takes_an_event_emitted_before_it(backend):
    emitted = backend.event_emit(key="paid:1", payload_json='{"amount": 30}')
    assert (emitted.created, emitted.woken) == (True, 0)
    job = _running(backend)
    got = backend.step_wait(
        job_id=job.id, token=job.lease_token, name="event:paid:1", key="paid:1", timeout_s=60
    )
    assert got.done and not got.timed_out and json.loads(got.result_json) == {"amount": 30}


def test_the_first_payload_wins(backend):
    assert backend.event_emit(key="k", payload_json='"first"').created
    assert not backend.event_emit(key="k", payload_json='"second"').created
    job = _running(backend)
    got = backend.step_wait(job_id=job.id, token=job.lease_token, name="w", key="k", timeout_s=1)
    assert json.loads(got.result_json) == "first"


def test_a_wait_times_out_at_its_stored_deadline(backend):
    job = _running(backend)
    t0 = datetime.now(UTC)
    wait = dict(job_id=job.id, token=job.lease_token, name="w", key="never")
    first = backend.step_wait(timeout_s=60, now=t0, **wait)
    assert not first.done and abs(first.due_in_s - 60) < 0.01
    # a later call's timeout does not move the deadline
    mid = backend.step_wait(timeout_s=600, now=t0 + timedelta(seconds=50), **wait)
    assert not mid.done and abs(mid.due_in_s - 10) < 0.01
    late = backend.step_wait(timeout_s=60, now=t0 + timedelta(seconds=61), **wait)
    assert late.done and late.timed_out
    backend.event_emit(key="never", payload_json="1")  # too late: the wait has ended
    again = backend.step_wait(timeout_s=60, **wait)
    assert again.timed_out


def test_an_emit_wakes_a_scheduled_waiter(backend):
    register(backend, "w1")
    job = _running(backend)
    wait = dict(job_id=job.id, token=job.lease_token, name="w", key="go", timeout_s=3600)
    assert not backend.step_wait(**wait).done
    snooze = done(job, state="scheduled", outcome="snoozed", retry_in_s=3600.0)
    assert backend.job_finalize_many(worker_id="w1", outcomes=[snooze]) == [job.id]
    assert backend.job_get(job_id=job.id).state == "scheduled"
    emitted = backend.event_emit(key="go", payload_json='"x"')
    assert (emitted.created, emitted.woken) == (True, 1)
    assert backend.job_get(job_id=job.id).state == "available"
    [rerun] = fetch(backend)
    got = backend.step_wait(**{**wait, "token": rerun.lease_token})
    assert got.done and json.loads(got.result_json) == "x"


def test_an_emit_while_the_waiter_still_runs_is_caught_by_the_leaders_pass(backend):
    """The race: the waiter looks (no event), the emit comes while the job still
    runs (nothing scheduled to wake), then the waiter's outcome schedules it at its
    deadline. The leader's pass finds the event and wakes it."""
    register(backend, "w1")
    job = _running(backend)
    wait = dict(job_id=job.id, token=job.lease_token, name="w", key="race", timeout_s=86400)
    assert not backend.step_wait(**wait).done
    assert backend.event_emit(key="race", payload_json="7").woken == 0  # still running
    snooze = done(job, state="scheduled", outcome="snoozed", retry_in_s=86400.0)
    backend.job_finalize_many(worker_id="w1", outcomes=[snooze])
    assert backend.job_get(job_id=job.id).state == "scheduled"
    Maintenance(backend).step()  # the leader's pass, every second
    assert backend.job_get(job_id=job.id).state == "available"
    assert backend.event_wake_waiters() == 0
    [rerun] = fetch(backend)
    assert rerun.attempts == 1  # the snooze gave the attempt back
    got = backend.step_wait(**{**wait, "token": rerun.lease_token})
    assert json.loads(got.result_json) == 7
    # taken: the wait is done, so nothing wakes the job again for this event
    backend.job_finalize_many(worker_id="w1", outcomes=[snooze._replace(token=rerun.lease_token)])
    assert backend.event_wake_waiters() == 0


def test_steps_go_with_their_job(backend):
    register(backend, "w1")
    job = _running(backend)
    backend.step_save(job_id=job.id, token=job.lease_token, name="a", kind="step", result_json="1")
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job)])
    other = _running(backend)
    backend.step_save(
        job_id=other.id, token=other.lease_token, name="a", kind="step", result_json="2"
    )
    backend.job_finalize_many(worker_id="w1", outcomes=[done(other, state="failed")])
    assert backend.job_delete_many(filter=JobFilter(ids=[job.id])) == [job.id]
    assert backend.step_list(job_id=job.id) == []
    pruned = backend.job_prune(state="failed", older_than_s=0, now=datetime.now(UTC) + timedelta(1))
    assert pruned == 1 and backend.job_get(job_id=other.id) is None
    # a dropped day partition (PostgreSQL, MariaDB) takes its jobs without a row
    # delete of ours: the maintenance's next sweep (after each prune) takes their steps
    backend.event_prune(older_than_s=86400)
    assert backend.step_list(job_id=other.id) == []


def test_old_events_are_pruned(backend):
    t0 = datetime.now(UTC)
    backend.event_emit(key="old", payload_json="1", now=t0 - timedelta(days=40))
    backend.event_emit(key="new", payload_json="2", now=t0)
    assert backend.event_prune(older_than_s=30 * 86400, now=t0) == 1
    assert backend.event_emit(key="new", payload_json="3").created is False
    assert backend.event_emit(key="old", payload_json="4").created is True


def test_a_name_stored_for_another_kind_or_key_comes_back_unchanged(backend):
    job = _running(backend)
    token = job.lease_token
    backend.step_save(job_id=job.id, token=token, name="s", kind="step", result_json="1")
    clash = backend.step_wait(job_id=job.id, token=token, name="s", key="k", timeout_s=5)
    assert (clash.kind, clash.result_json) == ("step", "1")
    backend.step_wait(job_id=job.id, token=token, name="w", key="a", timeout_s=60)
    backend.event_emit(key="b", payload_json='"b"')
    other = backend.step_wait(job_id=job.id, token=token, name="w", key="b", timeout_s=60)
    assert (other.event_key, other.done, other.result_json) == ("a", False, None)
