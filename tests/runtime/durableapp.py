"""The app of the durable-steps process tests: ``conveyor worker --app
tests.runtime.durableapp:app``. Each step appends ``<kind> <job id> <pid>`` to
$EFFECTS_FILE (one short O_APPEND write: lines of several processes never mix)."""

from __future__ import annotations

import os
from datetime import timedelta

from conveyor import Conveyor, current_job

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL"))


def record(kind: str) -> str:
    line = f"{kind} {current_job().id} {os.getpid()}\n".encode()
    fd = os.open(os.environ["EFFECTS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return kind


@app.task
def sleeper(seconds: float) -> list[str]:
    ctx = current_job()
    one = ctx.step("one", record, "sleeper-one")
    ctx.sleep("nap", timedelta(seconds=seconds))
    two = ctx.step("two", record, "sleeper-two")
    return [one, two]


@app.task
async def awaiter(key: str) -> object:
    ctx = current_job()
    await ctx.step("one", record, "awaiter-one")
    paid = await ctx.wait_for_event(key, timeout=timedelta(days=1))
    await ctx.step("two", record, "awaiter-two")
    return paid
