"""A user's FastAPI app running Conveyor through ``conveyor_lifespan``: the API and
dashboard at /conveyor and a worker beside the web app (served by uvicorn in the
tests; the database URL comes from CONVEYOR_DATABASE_URL)."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi import FastAPI

from conveyor import Conveyor
from conveyor.contrib.fastapi import conveyor_lifespan

conveyor = Conveyor()


@conveyor.task
def add(a: int, b: int) -> int:
    return a + b


@conveyor.task
def slow(seconds: float, marker: str) -> str:
    Path(marker).write_text("started")
    time.sleep(seconds)
    return "finished"


app = FastAPI(
    lifespan=conveyor_lifespan(
        conveyor,
        prefix="/conveyor",
        worker=True,
        worker_options={"concurrency": 4, "grace_s": 30},
    )
)


@app.post("/sums")
async def create_sum(a: int, b: int) -> dict[str, int]:
    job = await add.asend(a, b)
    return {"job": job.id}
