"""``create_app``: the FastAPI app, its routers (one module per resource), the
error mapping and the body size limit.

Routers are built per app from a registry of factories, ``ROUTERS`` (prefix,
factory taking the ``ServerContext``); later features (events, metrics, the
dashboard) add theirs there or pass ``routers=`` to ``create_app``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI

from .. import __version__
from . import dashboard, errors, limits
from .context import DEFAULT_MAX_BODY, ServerContext, is_loopback
from .routes import (
    asyncflow,
    batches,
    events,
    health,
    jobs,
    leases,
    metrics,
    queues,
    tasks,
    tokens,
    workers,
)

if TYPE_CHECKING:
    from ..app import Conveyor
    from ..runtime.service import Services

log = logging.getLogger("conveyor.server")

RouterFactory = Callable[[ServerContext], APIRouter]

#: (prefix, factory): the routers every server gets, in order
ROUTERS: list[tuple[str, RouterFactory]] = [
    ("", health.router),
    ("/v1", jobs.router),
    ("/v1", batches.router),
    ("/v1", queues.router),
    ("/v1", workers.router),
    ("/v1", tasks.router),
    ("/v1", leases.router),
    ("/v1", tokens.router),
    ("/v1", events.router),
    ("", metrics.router),
    ("/api", asyncflow.router),
    ("", dashboard.router),
]


def create_app(
    conveyor_app: Conveyor,
    *,
    tokens_required: bool | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    run_services: bool = False,
    routers: Sequence[tuple[str, RouterFactory]] = (),
    max_wait_s: float = 30.0,
    worker_ttl_s: float = 7.0,
    asyncflow_deadline_s: float = 30.0,
) -> FastAPI:
    """The HTTP server for ``conveyor_app``: REST under ``/v1``, asyncflow's API under
    ``/api``, ``/healthz`` and ``/readyz``, OpenAPI at ``/openapi.json``.

    ``run_services``: run the leader-elected cluster services (rescuing dead
    workers' jobs, scheduling, batches, cron) in this process, as ``conveyor
    server`` does: a deployment with only remote workers needs them somewhere.
    ``routers``: more (prefix, factory) pairs after ``ROUTERS``. ``max_wait_s``:
    the longest a lease request long-polls; ``worker_ttl_s``: remote workers silent
    this long are dead; ``asyncflow_deadline_s``: asyncflow's hold_task deadline
    when the task type sets no ``max_processing_s``.
    """
    ctx = ServerContext(
        conveyor_app,
        tokens_required=tokens_required,
        max_body_bytes=max_body_bytes,
        max_wait_s=max_wait_s,
        worker_ttl_s=worker_ttl_s,
        asyncflow_deadline_s=asyncflow_deadline_s,
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        services = _start_services(ctx) if run_services else None
        try:
            yield
        finally:
            if services is not None:
                services.stop()

    app = FastAPI(
        title="Conveyor",
        version=__version__,
        summary="A durable task queue whose only infrastructure is a database.",
        lifespan=lifespan,
    )
    app.state.conveyor = ctx
    for prefix, factory in [*ROUTERS, *routers]:
        app.include_router(factory(ctx), prefix=prefix)
    errors.install(app)
    app.add_middleware(limits.BodyLimit, max_bytes=max_body_bytes)
    return app


def _start_services(ctx: ServerContext) -> Services:
    holder = f"server@{socket.gethostname()}:{id(ctx):x}"
    services = ctx.conveyor.cluster_services(holder, worker_ttl_s=ctx.worker_ttl_s)
    services.start()
    log.info("cluster services running in the server (leader candidate %s)", holder)
    return services


__all__ = ["ROUTERS", "RouterFactory", "ServerContext", "create_app", "is_loopback"]
