"""The app that ``conveyor bench`` runs under real ``conveyor worker`` processes.

Its handlers do nothing but note when they ran: the first start and last end of
the drain (so a rate is jobs / (last end - first start), as the shared peer
harness measures every queue), and each latency job's delay from its send. The
notes are written as JSON to ``$CONVEYOR_BENCH_OUT`` when the worker exits.
"""

from __future__ import annotations

import atexit
import json
import os
import time

from conveyor import Conveyor

QUEUE = "conveyor_bench"

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL"))
_notes: dict[str, float | None] = {"first": None, "last": None, "count": 0}
_delays: list[float] = []


@app.task(queue=QUEUE, name="conveyor_bench.noop")
async def noop(i: int = 0) -> None:
    now = time.time()
    if _notes["first"] is None:
        _notes["first"] = now
    _notes["last"] = now
    _notes["count"] = (_notes["count"] or 0) + 1


@app.task(queue=QUEUE, name="conveyor_bench.ping")
async def ping(sent: float) -> None:
    _delays.append(time.time() - sent)


@atexit.register
def _dump() -> None:
    out = os.environ.get("CONVEYOR_BENCH_OUT")
    if out:
        with open(out, "w") as f:
            json.dump({**_notes, "delays": _delays}, f)
