"""The app bench_scale.py runs under real ``conveyor worker`` processes (CLI defaults)."""

from __future__ import annotations

import os

from conveyor import Conveyor

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL"))


@app.task(queue="bench_scale")
async def noop(i: int) -> None:
    return None
