"""Workflows with real worker processes: the leader and another worker killed
(SIGKILL) mid-run; the run still ends with exact results, each node made once."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest

from .helpers import wait_for

pytestmark = pytest.mark.slow

N = 1000


def test_a_map_of_1000_survives_the_leader_and_a_worker_killed(procs):
    from conveyor import Conveyor

    app = Conveyor(procs.env["CONVEYOR_DATABASE_URL"])
    numbers = app.task(name="numbers")(lambda n: None)
    item = app.task(name="item")(lambda i: None)
    total = app.task(name="total")(lambda xs: None)
    wf = app.workflow("fan", idempotency_key="fan-1")
    n = wf.add(numbers.s(N))
    m = wf.map(item.s(), over=n)
    t = wf.add(total.s(), after=[m])
    options = {
        "concurrency": 20,
        "lease_s": 2,
        "heartbeat_s": 0.5,
        "maintenance_s": 0.3,
        "leader_ttl_s": 2,
        "flow_poll_s": 0.3,
    }
    # The first worker is the only one when it starts: it takes the leadership.
    leader = procs.worker(**options)
    wait_for(lambda: " started: " in leader.log.read_text(), timeout=60, what="leader up")
    time.sleep(0.5)
    run = wf.start()
    other, survivor = procs.worker(**options), procs.worker(**options)

    def frozen_mid_run(victim) -> bool:
        lines = procs.lines("item")
        if len(lines) < 150 or victim.pid not in {pid for _, pid in lines}:
            return False
        victim.send_signal(signal.SIGSTOP)
        running = app.list_jobs(state="running", limit=200)
        if any(f":{victim.pid}:" in (j.lease_owner or "") for j in running):
            return True
        victim.send_signal(signal.SIGCONT)
        return False

    wait_for(lambda: "is now the leader" in leader.log.read_text(), timeout=30, what="leader")
    for victim in (leader, other):
        wait_for(lambda v=victim: frozen_mid_run(v), timeout=90, what="a victim mid-run")
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    assert run.wait(timeout=120) == "succeeded"
    # the survivor took the leadership over and settled the rest of the graph
    assert "is now the leader" in survivor.log.read_text()
    assert run.result(t) == sum(range(N))
    assert run.result(m) == list(range(N))
    time.sleep(1.0)  # a duplicate node job, if there were one, would have run by now
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(20) == 0
    kinds = [ln.split()[0] for ln in procs.effects.read_text().splitlines()]
    assert kinds.count("numbers") == 1
    assert [k for k in kinds if k.startswith("total:")] == [f"total:{sum(range(N))}:{N}:{N}"]
    items = run.items(m)
    assert len(items) == N and all(i.state == "succeeded" for i in items)
    assert len({i.job_id for i in items}) == N  # one job per item, made once
    ran = Counter(job for job, _ in procs.lines("item"))
    assert set(ran) == {i.job_id for i in items}  # nothing lost
    rescued = [i for i in items if app.get_job(i.job_id).attempts > 1]
    assert rescued, "no item was in flight when the workers were killed"
    app.close()
