"""``/v1/queues``: every queue with its counts per state; pause, resume, and
limits (concurrency, rate). A queue nobody has used yet needs ``force``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import Field

from ... import serialize
from ...app import Conveyor
from ..auth import ADMIN, READ, requires
from ..dependencies import Facade
from ..models import MAX_INT32, Name, Strict

QueuePath = Annotated[Name, Path(description="the queue's name")]


class QueueAction(Strict):
    force: bool = Field(False, description="allow a queue that has no jobs or settings yet")


class ConcurrencyLimit(QueueAction):
    max_running: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = Field(
        description="at most this many of its jobs run at once, cluster-wide; null: no limit"
    )


class RateLimit(QueueAction):
    rate_limit: (
        Annotated[str, Field(min_length=3, max_length=40, pattern=r"^[0-9. ]+/ ?[a-z]+$")] | None
    ) = Field(description='a token bucket for the whole queue, e.g. "100/m"; null: no limit')
    burst: Annotated[float, Field(ge=1, le=1e9, allow_inf_nan=False)] | None = None


router = APIRouter(tags=["queues"])


def _queue(app: Conveyor, name: str) -> dict[str, Any]:
    found = next((q for q in app.queues() if q.name == name), None)
    return {"name": name} if found is None else serialize.queue(found)


@router.get("/queues", summary="Queues with their counts per state", dependencies=[requires(READ)])
def list_queues(app: Facade) -> Any:
    return {"queues": [serialize.queue(q) for q in app.queues()]}


@router.post(
    "/queues/{name}/pause",
    summary="Pause a queue (running jobs finish)",
    dependencies=[requires(ADMIN)],
)
def pause(name: QueuePath, app: Facade, body: QueueAction | None = None) -> Any:
    app.pause_queue(name, force=bool(body and body.force))
    return _queue(app, name)


@router.post(
    "/queues/{name}/resume",
    summary="Resume a paused queue",
    dependencies=[requires(ADMIN)],
)
def resume(name: QueuePath, app: Facade, body: QueueAction | None = None) -> Any:
    app.resume_queue(name, force=bool(body and body.force))
    return _queue(app, name)


@router.put(
    "/queues/{name}/concurrency",
    summary="Cap the queue's running jobs",
    dependencies=[requires(ADMIN)],
)
def concurrency(name: QueuePath, body: ConcurrencyLimit, app: Facade) -> Any:
    app.set_queue_limit(name, body.max_running, force=body.force)
    return _queue(app, name)


@router.put(
    "/queues/{name}/rate-limit",
    summary="Rate-limit the queue",
    dependencies=[requires(ADMIN)],
)
def rate(name: QueuePath, body: RateLimit, app: Facade) -> Any:
    app.set_queue_rate_limit(name, body.rate_limit, body.burst, force=body.force)
    return _queue(app, name)
