"""A worker process for the real-process tests: ``python -m tests.runtime.procapp '<json opts>'``.

Each handler appends a line to $EFFECTS_FILE (O_APPEND, one short write each, so
lines from concurrent processes never interleave) to record its side effects.
"""

from __future__ import annotations

import asyncio
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
def raced(i: int) -> int:
    race_partner()
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


@app.task
async def item(i: int) -> int:
    record("item")
    await asyncio.sleep(0.05)
    return i


@app.task
def numbers(n: int) -> list[int]:
    record("numbers")
    return list(range(n))


@app.task
def total(xs: list[int]) -> int:
    record(f"total:{sum(xs)}:{len(xs)}:{len(set(xs))}")
    return sum(xs)


@app.task(queue="callbacks")
def batch_done(batch_id: int, counts: dict) -> str:
    record(f"callback:{counts.get('succeeded', 0)}:{counts.get('failed', 0)}")
    return "done"


def record_span(kind: str, start: float) -> None:
    record(f"{kind}|{start}|{time.time()}")


_met_another = False


def race_partner() -> None:
    """The first job a process runs waits (up to 15 s) until another process has
    started a job too: racing tests then race for sure instead of by luck."""
    global _met_another
    if _met_another:
        return
    began = os.environ["EFFECTS_FILE"] + ".began"
    fd = os.open(began, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with open(began) as f:
            if len({line.strip() for line in f if line.strip()}) >= 2:
                break
        time.sleep(0.02)
    _met_another = True


@app.task(queue="keyed", concurrency_key="user", concurrency_limit=2)
async def per_user(user: str, i: int) -> None:
    await asyncio.to_thread(race_partner)
    start = time.time()
    await asyncio.sleep(0.05)
    record_span(f"user:{user}", start)


@app.task(queue="capped")
def capped(i: int) -> None:
    race_partner()
    start = time.time()
    time.sleep(0.03)
    record_span("capped", start)


@app.task(queue="rated", rate_limit="10/s")
async def rated(i: int) -> None:
    record(f"rated|{time.time()}")


def create_batch(key: str, n: int, start_at: float) -> None:
    """Race mode: wait for a common instant, then create the batch."""
    time.sleep(max(0.0, start_at - time.time()))
    batch = item.batch([(i,) for i in range(n)], idempotency_key=key, on_complete=batch_done)
    print(json.dumps({"id": batch.id, "created": batch.created}), flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    if len(sys.argv) > 1 and sys.argv[1] == "create-batch":
        create_batch(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
        sys.exit(0)
    options = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    Worker(app, **options).run()
