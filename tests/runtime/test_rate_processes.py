"""A rate limit shared by three racing worker processes through the database."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slow

RATE, WINDOW = 40.0, 10.0


def test_three_workers_together_keep_to_the_rate(procs, producer):
    producer.task(name="rated", queue="rated", rate_limit=f"{RATE:g}/s")(lambda i: None)
    producer.tasks["rated"].send_many([(i,) for i in range(int(RATE * (WINDOW + 8)))])
    workers = [procs.worker(queues=["rated"], concurrency=10) for _ in range(3)]
    # The window is counted from the first job's start, so it is watched whole,
    # however long a loaded machine takes to start the workers.
    deadline = time.monotonic() + 60
    while not (starts := _starts(procs)) or time.time() < starts[0] + 2.0 + WINDOW + 1.0:
        assert time.monotonic() < deadline, "the workers did not run the window's jobs"
        time.sleep(0.2)
    starts = _starts(procs)
    for w in workers:
        w.terminate()
        w.wait(20)
    # skip the first 2 s (the initial burst and start-up), then count a window
    t0 = starts[0] + 2.0
    in_window = [t for t in starts if t0 <= t < t0 + WINDOW]
    achieved = len(in_window) / WINDOW
    # Never over the limit (the point of it); and near it, unless the machine is
    # too loaded to claim that fast (21/s at load 15-30 on 2 cores): at least half.
    assert achieved <= 1.1 * RATE, f"achieved {achieved:.2f}/s for a limit of {RATE}/s"
    assert achieved >= 0.5 * RATE, f"only {achieved:.2f}/s for a limit of {RATE}/s"
    pids = {
        int(pid) for _k, _j, pid in (ln.split() for ln in procs.effects.read_text().splitlines())
    }
    assert len(pids) >= 2, "the workers shared the work"
    # nothing ran twice and nothing used an attempt while waiting
    assert all(j.attempts <= 1 for j in producer.list_jobs(limit=1000))


def _starts(procs) -> list[float]:
    """When each job started (the workers' clock: the same machine's)."""
    if not procs.effects.exists():
        return []
    return sorted(
        float(kind.split("|")[1])
        for kind, _job, _pid in (ln.split() for ln in procs.effects.read_text().splitlines())
    )
