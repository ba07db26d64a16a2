"""``/v1/workers``: every registered worker, in-process or remote (host, pid,
queues, running jobs, heartbeat age, alive or silent); stop one; and the
heartbeat remote workers send to keep the jobs they hold."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import Field

from ... import serialize
from ...errors import JobNotFound
from ...records import WorkerInfo
from ..auth import ADMIN, READ, WORKER, requires
from ..context import ServerContext
from ..models import MAX_INT32, Name, Strict

WorkerPath = Annotated[Name, Path(description="the worker's id")]


class WorkerRegistration(Strict):
    """Who a remote worker is, recorded on its first heartbeat or lease."""

    queues: list[Name] = Field(default_factory=lambda: ["default"], min_length=1, max_length=100)
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


def router(ctx: ServerContext) -> APIRouter:
    app = ctx.conveyor
    r = APIRouter(tags=["workers"])

    def show(info: WorkerInfo) -> dict[str, Any]:
        return serialize.worker(info, ttl_s=ctx.worker_ttl_s)

    @r.get("/workers", summary="Workers, alive or silent", dependencies=[requires(ctx, READ)])
    def list_workers() -> Any:
        return {"workers": [show(w) for w in app.workers()]}

    @r.get("/workers/{worker_id}", summary="One worker", dependencies=[requires(ctx, READ)])
    def get_worker(worker_id: WorkerPath) -> Any:
        return show(app.get_worker(worker_id))

    @r.post(
        "/workers/{worker_id}/stop",
        summary="Ask a worker to drain and exit",
        dependencies=[requires(ctx, ADMIN)],
    )
    def stop_worker(worker_id: WorkerPath) -> Any:
        if not app.stop_worker(worker_id):
            raise JobNotFound(f"no worker with id {worker_id!r}")
        return show(app.get_worker(worker_id))

    @r.post(
        "/workers/{worker_id}/heartbeat",
        summary="A remote worker is alive",
        dependencies=[requires(ctx, WORKER)],
    )
    def heartbeat(
        worker_id: WorkerPath, request: Request, body: WorkerRegistration | None = None
    ) -> Any:
        """Send one every couple of seconds (well within the worker ttl, 7 s by
        default): a worker keeps its jobs for as long as it heartbeats. The answer
        lists the jobs it still holds, those an operator asked to cancel, and
        whether it should stop."""
        beat = app.heartbeat_worker(worker_info(worker_id, body or WorkerRegistration(), request))
        return {
            "held": sorted(beat.held),
            "cancel": sorted(beat.cancel),
            "stop": beat.stop,
            "heartbeat_s": min(2.0, ctx.worker_ttl_s / 3),
        }

    return r
