"""A PostgreSQL server that crashes (every server process gone at once, as on a
power cut of its machine) right after claims: a claim commits without waiting
for the disk, so the crash may undo it. Whatever it undid, every job still ends
once: an outcome for an undone claim is refused, the job is claimed again and
runs again (at-least-once), and the counts agree with the jobs."""

from __future__ import annotations

import pytest

from conveyor import Conveyor
from conveyor.records import Finalize

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
