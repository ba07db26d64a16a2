"""Where an idle worker's enqueue-to-start time goes (issue 41), traced inside a
real `conveyor worker` process on PostgreSQL.

    python bench/lab/idle_latency.py [-n 200]

Makes the database ``lab_idle_latency`` (dropped first) on $PEERBENCH_PG (as the
other benchmarks; 127.0.0.1:5432 by default), starts `conveyor worker
--app idle_latency:app --queues bench` with this file as the app, and sends -n
no-op jobs one at a time at 50/s from this process, as the shared harness's
phase c does. The worker, with this module imported as its app, wraps three
methods to note the time: the notifier's wait returning a hint, the claim's start
and end. Per job: the send (call to return), the send's return to the hint's
arrival, the hint to the claim, the claim, the claim's end to the handler's
start, and the whole. Prints p50 / p90 of each, in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from _bench import PG_BASE, SCRATCH, fresh_database  # noqa: E402

OUT = Path("/tmp/lab_idle_latency.json")
READY = Path("/tmp/lab_idle_latency.ready")
events: list[tuple[str, float]] = []


def _instrument() -> None:
    """In the worker process: note when a hint arrives and when claims run."""
    from conveyor.backends.postgres import backend, notifier

    wait = notifier.PostgresNotifier.wait
    claim = backend.PostgresBackend.job_claim

    def timed_wait(self: Any, timeout: float) -> set[str]:
        hints = wait(self, timeout)
        if hints:
            events.append(("hint", time.time()))
        return hints

    def timed_claim(self: Any, **kwargs: Any) -> Any:
        began = time.time()
        jobs = claim(self, **kwargs)
        if jobs:
            events.append(("claim", began))
            events.append(("claimed", time.time()))
        return jobs

    notifier.PostgresNotifier.wait = timed_wait  # type: ignore[method-assign]
    backend.PostgresBackend.job_claim = timed_claim  # type: ignore[method-assign]


if os.environ.get("LAB_ROLE") == "worker":
    _instrument()

from conveyor import Conveyor  # noqa: E402

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///:memory:"))
N = int(os.environ.get("LAB_N", "200"))
started: list[tuple[float, float]] = []


@app.task(name="noop", queue="bench")
async def noop(t: float, warm: bool) -> None:
    now = time.time()
    if warm:
        READY.touch()
        return
    started.append((t, now))
    if len(started) == N:
        OUT.write_text(json.dumps({"jobs": started, "events": events}))
        os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=200)
    args = p.parse_args()
    fresh_database("postgres", "lab_idle_latency", SCRATCH / "lab_idle_latency.db")
    url = f"{PG_BASE}/lab_idle_latency"
    producer = Conveyor(url)
    producer.task(name="noop", queue="bench")(noop.fn)
    producer.migrate()
    for f in (OUT, READY):
        f.unlink(missing_ok=True)
    env = {
        **os.environ,
        "CONVEYOR_DATABASE_URL": url,
        "LAB_ROLE": "worker",
        "LAB_N": str(args.n),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "conveyor", "worker", "--app", "idle_latency:app"]
    worker = subprocess.Popen([*cmd, "--queues", "bench"], env=env, stderr=subprocess.DEVNULL)
    send = producer.tasks["noop"].send
    while not READY.exists():
        send(time.time(), True)
        time.sleep(0.3)
    time.sleep(1.0)
    returned = []
    due = time.monotonic()
    for _ in range(args.n):
        due += 1 / 50
        time.sleep(max(0.0, due - time.monotonic()))
        t = time.time()
        send(t, False)
        returned.append(time.time())
    worker.wait(60)
    producer.close()
    data = json.loads(OUT.read_text())
    parts: dict[str, list[float]] = {}
    for (sent, start), back in zip(data["jobs"], returned, strict=True):
        seen = {kind: at for kind, at in data["events"] if sent <= at <= start}
        spans = {"send (call to return)": back - sent, "send to start (all)": start - sent}
        if {"hint", "claim", "claimed"} <= seen.keys():
            spans |= {
                "return to hint": seen["hint"] - back,
                "hint to claim": seen["claim"] - seen["hint"],
                "claim (one job)": seen["claimed"] - seen["claim"],
                "claimed to handler": start - seen["claimed"],
            }
        for name, s in spans.items():
            parts.setdefault(name, []).append(s * 1000)
    for name, ms in parts.items():
        ms.sort()
        print(
            f"{name:24s} n={len(ms):4d} p50 {statistics.median(ms):6.2f}"
            f"  p90 {ms[int(len(ms) * 0.9)]:6.2f} ms"
        )


if __name__ == "__main__":
    main()
