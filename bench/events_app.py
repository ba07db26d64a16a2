"""The app bench_events.py runs under a real ``conveyor worker`` (CLI defaults)."""

from __future__ import annotations

import os

from conveyor import Conveyor

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL"))


@app.task(queue="bench_events")
async def noop(i: int) -> None:
    return None
