"""A PostgreSQL server that crashes (every server process gone at once, as on a
power cut of its machine) right after claims: a claim commits without waiting
for the disk, so the crash may undo it. Whatever it undid, every job still ends
once: an outcome for an undone claim is refused, the job is claimed again and
runs again (at-least-once), and the counts agree with the jobs."""

from __future__ import annotations

from collections import Counter

import pytest

from conveyor import Conveyor
from conveyor.records import Finalize

from ..runtime.conftest import Procs
from .conftest import wait_until

pytestmark = pytest.mark.slow


def _succeed(backend, jobs) -> list[int]:
    outcomes = [
        Finalize(
            job_id=j.id,
            token=str(j.lease_token),
            state="succeeded",
            outcome="succeeded",
            ran_attempt=j.attempts,
        )
        for j in jobs
    ]
    return backend.job_finalize_many(worker_id="w1", outcomes=outcomes)


def test_claims_undone_by_a_crash_run_again_and_count_once(cluster):
    app = Conveyor(cluster.url)
    app.task(name="t", queue="q")(lambda i: None)
    app.migrate()
    backend = app.backend
    try:
        sent = app.tasks["t"].send_many([(i,) for i in range(30)])  # durable
        undone = kept = 0
        for _ in range(3):
            claimed = backend.job_claim(queues=["q"], worker_id="w1", limit=10)
            assert len(claimed) == 10
            cluster.crash()  # at once: the claims' WAL may still be in the server's buffers
            cluster.start()
            # the claims that survived take their outcome, undone ones are refused;
            # the first call after the restart: the pool's connections from before
            # the crash are dead, and it must notice before using one
            accepted = set(_succeed(backend, claimed))
            undone += len(claimed) - len(accepted)
            kept += len(accepted)
            for j in claimed:
                state = app.get_job(j.id).state
                assert state == ("succeeded" if j.id in accepted else "available"), (j.id, state)
        # what the crashes undid is claimed and run again, each job once
        while again := backend.job_claim(queues=["q"], worker_id="w2", limit=10):
            assert len(set(_succeed(backend, again))) == len(again)
        states = {j.id: app.get_job(j.id).state for j in sent}
        assert set(states.values()) == {"succeeded"}, states
        backend.counts_fold()
        counts = {c.state: c.count for c in app.counts() if c.queue == "q" and c.count}
        assert counts == {"succeeded": 30}, counts
        print(f"claims undone by the crashes: {undone}, kept: {kept}")
    finally:
        app.close()


def test_a_postmaster_killed_mid_drain_loses_nothing_and_counts_each_job_once(cluster, tmp_path):
    """kill -9 of the server (the postmaster and all its processes at once) while a
    worker process drains: after the restart the worker goes on by itself; every
    job's handler ran (its side effect is in the file), every job succeeded and is
    counted once. A job whose claim the crash undid ran again (at-least-once)."""
    producer = Conveyor(cluster.url)
    producer.task(name="effect")(lambda *a: None)
    producer.migrate()
    procs = Procs(cluster.url, tmp_path / "effects.log")
    n = 3_000
    try:
        sent = producer.tasks["effect"].send_many([(i,) for i in range(n)])
        worker = procs.worker(worker_ttl_s=5, heartbeat_s=0.5, concurrency=20)
        wait_until(lambda: len(procs.lines("ran")) >= 300, 60, "the drain under way")
        cluster.kill()  # mid-drain: claims, handlers and outcome writes in flight
        cluster.start()
        procs.drain_and_stop(producer, [worker])
        ran = Counter(job for job, _ in procs.lines("ran"))
        assert set(ran) == {j.id for j in sent}, "a job's handler never ran"
        again = sorted(j for j, times in ran.items() if times > 1)
        states = Counter(producer.get_job(j.id).state for j in sent)
        assert states == {"succeeded": n}, (states, again)
        producer.backend.counts_fold()
        counts = {c.state: c.count for c in producer.counts() if c.count}
        assert counts == {"succeeded": n}, (counts, again)
    finally:
        procs.cleanup()
        producer.close()
