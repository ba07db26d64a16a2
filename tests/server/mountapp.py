"""A user's own FastAPI app with Conveyor's server mounted inside it, at /queue
(served by uvicorn in the tests). The database URL comes from CONVEYOR_DATABASE_URL."""

from __future__ import annotations

from fastapi import FastAPI

from conveyor import Conveyor
from conveyor.server import create_app

conveyor = Conveyor()
parent = FastAPI(title="my shop")


@parent.get("/shop/ping")
def ping() -> dict[str, str]:
    return {"pong": "yes"}


parent.mount("/queue", create_app(conveyor))
