"""Handlers that take their process down, each in its own way, for the
``--processes`` tests: ``conveyor worker --app tests.runtime.crashapp:app``."""

from __future__ import annotations

import ctypes
import os
import sys
import time

from conveyor import Conveyor

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL"))


@app.task(max_attempts=1)
def segfault() -> None:
    ctypes.string_at(0)


@app.task(max_attempts=1)
def abort() -> None:
    os.abort()


@app.task(max_attempts=1)
def exits(code: int) -> None:
    sys.exit(code)


@app.task(max_attempts=1)
def hard_exit() -> None:
    os._exit(7)


@app.task(max_attempts=1)
def hog() -> None:
    chunks = []
    while True:
        chunks.append(bytearray(20_000_000))
        time.sleep(0.01)


@app.task(max_attempts=1, timeout=0.5)
def overrun(marker: str) -> None:
    time.sleep(2.5)
    with open(marker, "w") as f:  # a side effect after the timeout: must never happen
        f.write("ran past its timeout")


@app.task(max_attempts=2)
def crash_once(marker: str) -> str:
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), 9)
    return "second time lucky"


@app.task
def double(x: int) -> int:
    return x * 2


@app.task
async def adouble(x: int) -> int:
    return x * 2
