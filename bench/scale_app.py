"""The app bench_scale.py runs under real ``conveyor worker`` processes (CLI defaults)."""

from __future__ import annotations

import os

from conveyor import Conveyor

# SCALE_VACUUM=off: the leader never VACUUMs (the churn phase's control run)
app = Conveyor(
    os.environ.get("CONVEYOR_DATABASE_URL"),
    vacuum_dead_rows=None if os.environ.get("SCALE_VACUUM") == "off" else 50_000,
)


@app.task(queue="bench_scale")
async def noop(i: int) -> None:
    return None
