"""``/v1/workers``: the registered workers, in-process or remote (host, pid,
queues, running jobs, heartbeat age, alive or silent), a keyset page at a time;
stop one; and the heartbeat remote workers send to keep the jobs they hold."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import Field

from ... import serialize
from ...errors import JobNotFound
from ...records import WorkerInfo
from ..auth import ADMIN, READ, WORKER, requires
from ..context import ServerContext
from ..dependencies import Ctx
from ..models import MAX_INT32, Name, QueueName, Strict, cursor_name
from .jobs import page

WorkerPath = Annotated[Name, Path(description="the worker's id")]


class WorkerRegistration(Strict):
    """Who a remote worker is, recorded on its first heartbeat or lease."""

    queues: list[QueueName] = Field(
        default_factory=lambda: ["default"], min_length=1, max_length=100
    )
    tasks: list[Name] | None = Field(None, max_length=10_000, description="null: any task")
    tags: list[Name] = Field(default_factory=list, max_length=100)
    hostname: Name | None = Field(None, description="default: the client's address")
    pid: Annotated[int, Field(ge=0, le=MAX_INT32)] = 0
    concurrency: Annotated[int, Field(ge=1, le=100_000)] = 1


def worker_info(worker_id: str, reg: WorkerRegistration, request: Request) -> WorkerInfo:
    host = reg.hostname or (request.client.host if request.client else "remote")
    return WorkerInfo(
        id=worker_id,
        hostname=host,
        pid=reg.pid,
        queues=list(reg.queues),
        concurrency=reg.concurrency,
        tags=list(reg.tags),
        tasks=None if reg.tasks is None else list(reg.tasks),
    )


router = APIRouter(tags=["workers"])


def _show(ctx: ServerContext, info: WorkerInfo) -> dict[str, Any]:
    return serialize.worker(info, ttl_s=ctx.worker_ttl_s)


@router.get("/workers", summary="Workers, alive or silent", dependencies=[requires(READ)])
def list_workers(
    ctx: Ctx,
    alive: Annotated[
        bool | None,
        Query(
            description="true: only workers heard from within the worker ttl; false: "
            "only the silent ones"
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=400)] = None,
) -> Any:
    """By id. ``next_cursor`` (when there may be more) gives the next page."""
    found = ctx.conveyor.workers(
        limit=limit, after=cursor_name(cursor), alive=alive, worker_ttl_s=ctx.worker_ttl_s
    )
    return page("workers", [_show(ctx, w) for w in found], limit, found[-1].id if found else "")


@router.get("/workers/{worker_id}", summary="One worker", dependencies=[requires(READ)])
def get_worker(worker_id: WorkerPath, ctx: Ctx) -> Any:
    return _show(ctx, ctx.conveyor.get_worker(worker_id))


@router.post(
    "/workers/{worker_id}/stop",
    summary="Ask a worker to drain and exit",
    dependencies=[requires(ADMIN)],
)
def stop_worker(worker_id: WorkerPath, ctx: Ctx) -> Any:
    if not ctx.conveyor.stop_worker(worker_id):
        raise JobNotFound(f"no worker with id {worker_id!r}")
    return _show(ctx, ctx.conveyor.get_worker(worker_id))


@router.post(
    "/workers/{worker_id}/heartbeat",
    summary="A remote worker is alive",
    dependencies=[requires(WORKER)],
)
def heartbeat(
    worker_id: WorkerPath, request: Request, ctx: Ctx, body: WorkerRegistration | None = None
) -> Any:
    """Send one every couple of seconds (well within the worker ttl, 7 s by
    default): a worker keeps its jobs for as long as it heartbeats. The answer
    lists the jobs it still holds, those an operator asked to cancel, and
    whether it should stop."""
    info = worker_info(worker_id, body or WorkerRegistration(), request)
    beat = ctx.conveyor.serving.heartbeat_worker(info)
    return {
        "held": sorted(beat.held),
        "cancel": sorted(beat.cancel),
        "stop": beat.stop,
        "heartbeat_s": min(2.0, ctx.worker_ttl_s / 3),
    }
