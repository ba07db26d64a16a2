"""``create_app``: the FastAPI app, its routers (one module per resource), the
error mapping and the body size limit.

Each route module has one module-level ``router`` whose handlers take the
server's ``ServerContext`` (or the façade alone) as a dependency (see
``dependencies``); ``ROUTERS`` lists them with their prefixes, and every app
includes them all. ``routers=`` adds routers built for one app, from factories
taking its ``ServerContext``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI

from .. import __version__
from ..errors import ConfigError
from . import dashboard, errors, limits, openapi, outage, perimeter
from .context import DEFAULT_MAX_BODY, ServerContext, is_loopback
from .routes import (
    asyncflow,
    batches,
    emits,
    events,
    health,
    jobs,
    leases,
    metrics,
    queues,
    tasks,
    tokens,
    workers,
    workflows,
)

if TYPE_CHECKING:
    from ..app import Conveyor
    from ..runtime.service import Services

log = logging.getLogger("conveyor.server")

RouterFactory = Callable[[ServerContext], APIRouter]

#: (prefix, router): the routers every server gets, in order
ROUTERS: list[tuple[str, APIRouter]] = [
    ("", health.router),
    ("/v1", jobs.router),
    ("/v1", batches.router),
    ("/v1", workflows.router),
    ("/v1", queues.router),
    ("/v1", workers.router),
    ("/v1", tasks.router),
    ("/v1", leases.router),
    ("/v1", tokens.router),
    ("/v1", events.router),
    ("/v1", emits.router),
    ("", metrics.router),
    ("/api", asyncflow.router),
    ("", dashboard.router),
]


def create_app(
    conveyor_app: Conveyor,
    *,
    tokens_required: bool | None = None,
    reopen: bool = False,
    allowed_hosts: Sequence[str] = (),
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
    server`` does: a deployment with only remote workers needs them somewhere; and a
    worker of the ``conveyor`` queue, which runs the bulk actions (as jobs).
    ``routers``: more (prefix, factory) pairs after ``ROUTERS``. ``max_wait_s``:
    the longest a lease request long-polls; ``worker_ttl_s``: remote workers silent
    this long are dead; ``asyncflow_deadline_s``: asyncflow's hold_task deadline
    when the task type sets no ``max_processing_s``.

    Who may call it: until a first API token is created the server is open, to
    loopback clients only; from then on every request needs a token, even after
    the last one is revoked. ``reopen=True`` opens it again (to loopback) while no
    token is active; ``tokens_required=True`` always asks for one; ``False`` never
    does (an authenticating proxy in front, or a test). ``allowed_hosts``: the Host
    names it answers to besides the loopback ones (``name``, ``.name`` for it and
    its subdomains, ``*`` for any); browsers' cross-site writes are refused (see
    ``perimeter``). Mounted in your own app, pass the names your app is served under.

    Under Starlette's ``TestClient`` the client is ``testclient`` at Host
    ``testserver``, neither of them loopback, so an open server answers 400 (the
    Host) or 401 (the client). For a test, either send a token (create one with
    ``conveyor_app.create_token(...)``) with ``allowed_hosts=["testserver"]``, or::

        TestClient(create_app(app, tokens_required=False, allowed_hosts=["testserver"]))
    """
    ctx = ServerContext(
        conveyor_app,
        tokens_required=tokens_required,
        reopen=reopen,
        allowed_hosts=_allowed_hosts(allowed_hosts),
        max_body_bytes=max_body_bytes,
        max_wait_s=max_wait_s,
        worker_ttl_s=worker_ttl_s,
        asyncflow_deadline_s=asyncflow_deadline_s,
    )

    app = FastAPI(
        title="Conveyor",
        version=__version__,
        summary="A durable task queue whose only infrastructure is a database.",
        lifespan=_lifespan(ctx, run_services),
    )
    app.state.conveyor = ctx  # where the routes' dependencies find it
    for prefix, router in ROUTERS:
        app.include_router(router, prefix=prefix)
    for prefix, factory in routers:
        app.include_router(factory(ctx), prefix=prefix)
    errors.install(app)
    app.add_exception_handler(404, dashboard.not_found)  # an unknown page: the dashboard's
    openapi.install(app)
    app.add_middleware(limits.BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(outage.BoundedWaits, conveyor=conveyor_app)
    # the outermost layer: an unknown Host or a cross-site write is refused before anything
    app.add_middleware(
        perimeter.Perimeter,
        allowed_hosts=ctx.allowed_hosts,
        docs_paths=(app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url),
    )
    return app


def _lifespan(
    ctx: ServerContext, run_services: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        services = _start_services(ctx) if run_services else None
        try:
            yield
        finally:
            if services is not None:
                services.stop()

    return lifespan


def _allowed_hosts(entries: Sequence[str]) -> tuple[str, ...]:
    if isinstance(entries, str):
        entries = [entries]  # a lone name, not its letters
    try:
        return tuple(perimeter.allowed_host(e) for e in entries)
    except ValueError as exc:
        raise ConfigError(f"allowed_hosts: {exc}") from None


def _start_services(ctx: ServerContext) -> Services:
    """The leader-elected cluster services (rescuing the jobs of dead workers,
    scheduling, batches and chains, cron), for a server that runs no worker: one
    serving only remote workers still needs them. And a worker of Conveyor's own
    queue, running the bulk actions its routes start (``InternalWorker``)."""
    # imported here, not above: a server that runs them is the only one that loads the runtime
    from ..runtime.host import cluster_services
    from ..runtime.internal import InternalWorker

    holder = f"server@{socket.gethostname()}:{id(ctx):x}"
    services = cluster_services(ctx.conveyor, holder, worker_ttl_s=ctx.worker_ttl_s).services
    services.add(InternalWorker(ctx.conveyor, worker_ttl_s=ctx.worker_ttl_s))
    services.start()
    log.info("cluster services running in the server (leader candidate %s)", holder)
    return services


__all__ = ["ROUTERS", "RouterFactory", "ServerContext", "create_app", "is_loopback"]
