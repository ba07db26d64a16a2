"""Cluster-wide concurrency limits under racing worker processes, proven by
recording every execution's start and end and checking the overlap."""

from __future__ import annotations

from collections import defaultdict

import pytest

pytestmark = pytest.mark.slow


def max_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = peak = 0
    for _, step in events:  # an end at the same instant as a start is processed first
        now += step
        peak = max(peak, now)
    return peak


def test_limits_hold_across_three_racing_workers(procs, producer):
    producer.task(name="per_user", queue="keyed", concurrency_key="user", concurrency_limit=2)(
        lambda user, i: None
    )
    producer.task(name="capped", queue="capped")(lambda i: None)
    producer.set_queue_limit("capped", 3)
    producer.tasks["per_user"].send_many([(f"u{i % 3}", i) for i in range(60)])
    producer.tasks["capped"].send_many([(i,) for i in range(40)])
    # Each worker runs at most 3 at once, under limits that let 9 run: the first
    # job of each worker waits for another worker to start one (race_partner), so
    # the race happens, without ever blocking the others.
    workers = [
        procs.worker(queues=["keyed", "capped"], concurrency=3, poll_s=0.05) for _ in range(3)
    ]
    procs.drain_and_stop(producer, workers)

    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    pids: dict[str, set[int]] = defaultdict(set)
    for kind, _job, pid in (ln.split() for ln in procs.effects.read_text().splitlines()):
        name, start, end = kind.split("|")
        spans[name].append((float(start), float(end)))
        pids[name].add(int(pid))
    assert sum(len(v) for k, v in spans.items() if k.startswith("user:")) == 60
    assert len(spans["capped"]) == 40
    for user in ("user:u0", "user:u1", "user:u2"):
        assert max_overlap(spans[user]) == 2, f"{user}: limit 2 exceeded or never reached"
    assert max_overlap(spans["capped"]) == 3, "queue limit 3 exceeded or never reached"
    assert len(set().union(*pids.values())) >= 2, "the workers really raced"
