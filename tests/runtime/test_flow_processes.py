"""Batches with real worker processes: one killed mid-run, and racing creators."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from .conftest import ROOT
from .helpers import wait_for

pytestmark = pytest.mark.slow


def test_batch_survives_a_killed_worker_with_exact_counts_and_one_callback(procs, producer):
    from conveyor import Conveyor

    app = Conveyor(procs.env["CONVEYOR_DATABASE_URL"])
    app.task(name="item")(lambda i: None)
    callback = app.task(name="batch_done", queue="callbacks")(lambda batch_id, counts: None)
    batch = app.tasks["item"].batch([(i,) for i in range(2000)], name="big", on_complete=callback)
    options = {
        "queues": ["default", "callbacks"],
        "concurrency": 20,
        "lease_s": 2,
        "heartbeat_s": 0.5,
        "maintenance_s": 0.3,
        "leader_ttl_s": 2,
        "flow_poll_s": 0.3,
    }
    victim, survivor = procs.worker(**options), procs.worker(**options)

    def victim_frozen_mid_run() -> bool:
        """Both have worked, and the victim, frozen (SIGSTOP), holds leases: it
        cannot write its outcomes between this look and the kill (with no-op jobs
        it holds none for part of each claim cycle, and a look and then a kill
        sometimes found it between two)."""
        lines = procs.lines("item")
        if len(lines) < 300 or {pid for _, pid in lines} != {victim.pid, survivor.pid}:
            return False
        victim.send_signal(signal.SIGSTOP)
        running = app.list_jobs(state="running", limit=100)
        if any(f":{victim.pid}:" in (j.lease_owner or "") for j in running):
            return True
        victim.send_signal(signal.SIGCONT)
        return False

    wait_for(victim_frozen_mid_run, timeout=60, what="the victim mid-run")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    closed = batch.wait(timeout=120)
    wait_for(
        lambda: [k for k in _kinds(procs) if k.startswith("callback")],
        timeout=30,
        what="the callback ran",
    )
    time.sleep(1.0)  # a duplicate callback, if there were one, would show up by now
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(20) == 0
    assert closed.state == "succeeded"
    assert closed.counts == {"succeeded": 2000}
    assert batch.progress()["succeeded"] == 2000
    callbacks = [k for k in _kinds(procs) if k.startswith("callback")]
    assert callbacks == ["callback:2000:0"], "the callback must run exactly once"
    ran = Counter(job for job, _ in procs.lines("item"))
    assert set(ran) == {j.id for j in batch.jobs()}  # nothing lost
    assert {pid for _, pid in procs.lines("item")} >= {victim.pid, survivor.pid}
    # the kill interrupted real work: some jobs lost their lease and were redone
    rescued = [j for j in batch.jobs() if j.attempts > 1]
    assert rescued, "no job was in flight when the worker was killed"
    assert all(j.attempt_log()[0].outcome == "lost" for j in rescued)
    app.close()


def _kinds(procs) -> list[str]:
    if not procs.effects.exists():
        return []
    return [line.split()[0] for line in procs.effects.read_text().splitlines()]


def test_racing_processes_create_one_batch_per_idempotency_key(procs, producer):
    start_at = time.time() + 1.5
    creators = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.runtime.procapp",
                "create-batch",
                "req-77",
                "200",
                str(start_at),
            ],
            cwd=ROOT,
            env=procs.env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [json.loads(p.communicate(timeout=60)[0]) for p in creators]
    assert [p.returncode for p in creators] == [0, 0, 0]
    assert len({o["id"] for o in outputs}) == 1
    assert sorted(o["created"] for o in outputs) == [False, False, True]
    assert len(producer.list_batches()) == 1
    assert sum(c.count for c in producer.counts()) == 200
