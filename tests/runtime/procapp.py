"""A worker process for the real-process tests: ``python -m tests.runtime.procapp '<json opts>'``.

Each handler appends a line to $EFFECTS_FILE (O_APPEND, one short write each, so
lines from concurrent processes never interleave) to record its side effects.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time

from conveyor import Conveyor, current_job
from conveyor.runtime.worker import Worker

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL"))


def record(kind: str) -> None:
    line = f"{kind} {current_job().id} {os.getpid()}\n".encode()
    fd = os.open(os.environ["EFFECTS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@app.task
def effect(i: int) -> int:
    record("ran")
    return i


@app.task
def sleepy(seconds: float) -> str:
    record("start")
    time.sleep(seconds)
    record("end")
    return "slept"


@app.task(max_attempts=2)
def crash() -> None:
    record("crash")
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    options = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    Worker(app, **options).run()
