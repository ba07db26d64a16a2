"""LeaseStore: claiming, recording how attempts end (fenced), giving jobs back,
rescuing the jobs of dead workers, and the maintenance of waiting jobs."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta

from conveyor.records import Finalize, JobFilter, Lease, RescueResult

from .helpers import done, fetch, ins, later, register

# -- claiming ---------------------------------------------------------------------------


def test_claim_counts_an_attempt_and_hands_out_tokens(backend):
    backend.job_insert_many(jobs=[ins() for _ in range(3)])
    jobs = fetch(backend, n=2, worker="w9")
    assert len(jobs) == 2
    for j in jobs:
        assert (j.state, j.attempts, j.lease_owner) == ("running", 1, "w9")
        assert j.lease_token and j.lease_expires_at is None  # held while w9 heartbeats
    assert len({j.lease_token for j in jobs}) == 2
    assert len(fetch(backend, n=10)) == 1
    assert fetch(backend) == []


def test_claim_with_a_deadline_sets_one(backend):
    backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend, lease_s=30)
    assert job.lease_expires_at > datetime.now(UTC) + timedelta(seconds=20)


def test_claim_orders_by_priority_then_age(backend):
    low, high, high2, mid = backend.job_insert_many(
        jobs=[ins(priority=0), ins(priority=10), ins(priority=10), ins(priority=5)]
    )
    order = [j.id for j in fetch(backend, n=10)]
    assert order == [high.id, high2.id, mid.id, low.id]


def test_claim_only_from_given_queues(backend):
    a, b, _ = backend.job_insert_many(jobs=[ins(queue="a"), ins(queue="b"), ins(queue="c")])
    assert {j.id for j in fetch(backend, queues=("a", "b"))} == {a.id, b.id}


def test_claim_only_tasks_the_worker_can_run(backend):
    mine, other = backend.job_insert_many(jobs=[ins(task="mine"), ins(task="theirs")])
    assert [j.id for j in fetch(backend, tasks=["mine"])] == [mine.id]
    assert fetch(backend, tasks=["mine"]) == []
    assert fetch(backend, tasks=[]) == []  # a worker with no handlers takes nothing
    assert [j.id for j in fetch(backend, tasks=None)] == [other.id]  # None: any task


def test_code_older_than_the_schema_claims_nothing(backend):
    backend.job_insert_many(jobs=[ins(), ins()._replace(pinned_to='["gpu"]')])
    old = backend.latest_schema - 1
    assert fetch(backend, schema_version=old) == []
    assert fetch(backend, schema_version=old, tags=["gpu"]) == []
    assert len(fetch(backend, schema_version=backend.latest_schema)) == 1


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


def test_a_retry_may_raise_the_attempt_budget(backend):
    backend.job_insert_many(jobs=[ins(max_attempts=1)])
    [job] = fetch(backend)
    retry = done(job, state="scheduled", outcome="retry", retry_in_s=0, max_attempts=4)
    backend.job_finalize_many(worker_id="w1", outcomes=[retry])
    assert backend.job_get(job_id=job.id).max_attempts == 4


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


def test_a_batch_of_outcomes_answers_each_job_once_at_its_first_outcome(backend):
    """Plain successes go in one statement on some dialects, the rest row by row:
    a job named twice counts once, at its first outcome, and every result comes
    back as sent."""
    backend.job_insert_many(jobs=[ins(args=[i]) for i in range(5)])
    a, b, c, d, e = sorted(fetch(backend), key=lambda j: j.id)
    results = {
        a.id: json.dumps({"text": 'café ☃ "quoted" \\ back', "n": [1, 2.5, None]}),
        c.id: "null",
        e.id: json.dumps("x" * 50_000),
    }
    accepted = backend.job_finalize_many(
        worker_id="w1",
        outcomes=[
            done(e, result_json=results[e.id]),
            done(b, state="failed", error="boom"),
            done(a, result_json=results[a.id]),
            done(a, result_json="2"),  # again: refused, the first stands
            done(d, token="stale"),
            done(c, result_json=results[c.id]),
        ],
    )
    assert sorted(accepted) == sorted([e.id, b.id, a.id, c.id])  # each once
    for job_id, text in results.items():
        got = backend.job_get(job_id=job_id)
        assert (got.state, got.result, got.lease_owner) == ("succeeded", json.loads(text), "w1")
        assert backend.job_attempts(job_id=job_id)[0].outcome == "succeeded"
    assert backend.job_get(job_id=b.id).state == "failed"
    assert backend.job_get(job_id=d.id).state == "running"


def test_a_job_whose_cancel_was_requested_ends_cancelled_whatever_it_returned(backend):
    backend.job_insert_many(jobs=[ins(), ins()])
    a, b = fetch(backend)
    backend.job_cancel_many(filter=JobFilter(ids=[a.id, b.id]))
    backend.job_finalize_many(
        worker_id="w1", outcomes=[done(a, result_json="1"), done(b, state="failed", error="x")]
    )
    got = backend.job_get(job_id=a.id)
    assert (got.state, got.cancel_requested) == ("cancelled", False)
    assert "cancelled while running" in got.error
    assert [x.outcome for x in backend.job_attempts(job_id=a.id)] == ["cancelled"]
    assert backend.job_get(job_id=b.id).state == "failed"  # a failure stays one


def test_release_returns_job_without_consuming_an_attempt_and_leaves_a_trace(backend):
    backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend)
    assert backend.job_release_many(worker_id="w1", leases=[Lease(job.id, "stale")]) == []
    assert backend.job_release_many(worker_id="w1", leases=[Lease(job.id, job.lease_token)]) == [
        job.id
    ]
    got = backend.job_get(job_id=job.id)
    assert (got.state, got.attempts, got.lease_owner) == ("available", 0, None)
    [trace] = backend.job_attempts(job_id=job.id)
    assert (trace.attempt, trace.outcome, trace.worker_id) == (1, "released", "w1")
    # a released job's old token is dead
    assert backend.job_finalize_many(worker_id="w1", outcomes=[done(job)]) == []


# -- rescue: a job is its worker's while the worker heartbeats ------------------------------
def test_jobs_of_a_live_worker_are_never_rescued_however_long_they_run(backend):
    backend.job_insert_many(jobs=[ins()])
    register(backend, "w1")
    [job] = fetch(backend, worker="w1")
    for minutes in (1, 10, 60):  # the worker keeps heartbeating
        register(backend, "w1", now=later(minutes * 60))
        assert backend.job_rescue(worker_ttl_s=7, now=later(minutes * 60 + 5)) == RescueResult()
    assert backend.job_get(job_id=job.id).state == "running"


def test_jobs_of_a_silent_worker_are_requeued_counting_the_attempt(backend):
    backend.job_insert_many(jobs=[ins(max_attempts=3)])
    register(backend, "w1")
    [job] = fetch(backend, worker="w1")
    assert backend.job_rescue(worker_ttl_s=7, now=later(5)) == RescueResult()
    result = backend.job_rescue(worker_ttl_s=7, now=later(8))
    assert result.requeued == [job.id] and result.failed == []
    got = backend.job_get(job_id=job.id)
    assert (got.state, got.attempts, got.lease_token) == ("available", 1, None)
    assert "lease lost on attempt 1 of 3" in got.error and "stopped heartbeating" in got.error
    [lost] = backend.job_attempts(job_id=job.id)
    assert (lost.outcome, lost.worker_id) == ("lost", "w1")
    # the old holder is fenced out: its completion is refused and its heartbeat
    # no longer lists the job
    assert backend.job_finalize_many(worker_id="w1", outcomes=[done(job)]) == []
    assert register(backend, "w1").held == {}


def test_no_worker_is_judged_silent_until_the_leader_has_been_back_that_long(backend):
    """While the database was out of reach, no heartbeat could reach it: after a
    blip of a few seconds every live worker looked silent, and the leader that got
    back first requeued their jobs (or failed them on their last attempt). The
    rescue waits until the leader has been back for the workers' ttl: its own
    failed calls, and the leader election's, count."""
    from conveyor.runtime.maintenance import Maintenance

    class Blip:  # the real backend, whose next call fails as in an outage
        down = False

        def __getattr__(self, name: str):
            if self.down:
                self.down = False
                raise ConnectionError("the database is restarting")
            return getattr(backend, name)

    backend.job_insert_many(jobs=[ins(max_attempts=1)])
    register(backend, "w1", now=later(-60))  # its beats could not land while it was down
    [job] = fetch(backend, worker="w1")
    blip = Blip()
    election_lost: list[float | None] = [None]
    maintenance = Maintenance(blip, worker_ttl_s=1.0, lost_at=lambda: election_lost[0])  # type: ignore[arg-type]
    blip.down = True
    assert not maintenance.run_once()  # the leader's own call failed
    assert maintenance.run_once()
    assert backend.job_get(job_id=job.id).state == "running"  # not rescued yet
    time.sleep(1.1)
    election_lost[0] = time.monotonic()  # the election failed meanwhile
    assert maintenance.run_once()
    assert backend.job_get(job_id=job.id).state == "running"
    time.sleep(1.1)  # back for the ttl, and still silent: dead
    assert maintenance.run_once()
    assert backend.job_get(job_id=job.id).state == "failed"


def test_a_claim_by_an_unregistered_worker_is_rescued(backend):
    backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend, worker="ghost")
    assert backend.job_rescue(worker_ttl_s=7).requeued == [job.id]


def test_a_held_job_is_judged_by_its_own_deadline(backend):
    backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend, worker="held-by-a-client", lease_s=30)  # no worker row at all
    assert backend.job_rescue(worker_ttl_s=7, now=later(20)) == RescueResult()
    result = backend.job_rescue(worker_ttl_s=7, now=later(31))
    assert result.requeued == [job.id]
    assert "held past its deadline" in backend.job_get(job_id=job.id).error


def test_rescue_fails_a_job_that_lost_its_worker_on_the_last_attempt(backend):
    backend.job_insert_many(jobs=[ins(max_attempts=2)])
    for attempt in (1, 2):
        [job] = fetch(backend, worker=f"w{attempt}", now=later(10 * attempt))
        assert job.attempts == attempt
        backend.job_rescue(worker_ttl_s=7, now=later(10 * attempt + 2))
    got = backend.job_get(job_id=job.id)
    assert got.state == "failed"
    assert "no attempts left" in got.error and "lease lost on attempt 2 of 2" in got.error
    assert [a.outcome for a in backend.job_attempts(job_id=job.id)] == ["lost", "lost"]


def test_schedule_due_promotes_scheduled_jobs(backend):
    [res] = backend.job_insert_many(jobs=[ins(delay_s=30)])
    assert backend.job_schedule_due() == 0
    assert backend.job_schedule_due(now=later(31)) == 1
    assert backend.job_get(job_id=res.id).state == "available"


# -- waiting jobs: snooze, aging, retention --------------------------------------------------
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
    assert (got.priority, got.base_priority) == (7, 1)  # 1 + the cap of 6
    # the priority-5 job reached 11: base 5 + 6; order is by effective priority
    order = [j.priority for j in fetch(backend, n=3, now=later(1000))]
    assert order == [11, 7, 7]


def test_a_windowed_aging_pass_reads_only_the_jobs_that_crossed_a_boost(backend):
    [job] = backend.job_insert_many(jobs=[ins(priority=0)])

    def age(at, window):
        return backend.job_age_priorities(aging_s=10, max_boost=5, window_s=window, now=later(at))

    assert age(15, 10) == 1  # crossed 10 s within (5, 15]
    assert age(25, 6) == 1  # crossed 20 s within (19, 25]
    assert backend.job_get(job_id=job.id).priority == 2
    assert age(29, 2) == 0  # nothing crossed within (27, 29]
    assert age(200, 5) == 0  # 200 s is past the last boost's window: a full pass catches up
    assert age(200, None) == 1
    assert backend.job_get(job_id=job.id).priority == 5


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
