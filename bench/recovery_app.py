"""The app bench_recovery.py runs under real `conveyor worker` processes."""

from __future__ import annotations

import os
import time

from conveyor import Conveyor

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL"))


@app.task(max_attempts=5)
def long(log: str) -> None:
    with open(log, "a") as f:
        f.write(f"{time.time()} {os.getpid()}\n")
    time.sleep(3600)
