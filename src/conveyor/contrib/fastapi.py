"""Conveyor inside a FastAPI (or Starlette) app: one lifespan that opens the
database, mounts Conveyor's HTTP API (REST under ``PREFIX/v1``, the dashboard
under ``PREFIX/``) and, for small deployments, runs a worker beside the web app.

.. code-block:: python

    from fastapi import FastAPI
    from conveyor.contrib.fastapi import conveyor_lifespan
    from myapp.jobs import conveyor  # your Conveyor app, its tasks registered

    app = FastAPI(lifespan=conveyor_lifespan(conveyor, prefix="/conveyor", worker=True))

The mounted API keeps the server's perimeter: it answers only the Host names in
``allowed_hosts`` (besides loopback ones), and until a first API token exists
(``conveyor tokens create``) only loopback clients; then every request needs a
token. Pass the names your app is served under, and create tokens for callers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from starlette.applications import Starlette

from .. import Conveyor
from ..errors import ConfigError
from ..registry import user_tasks
from ..runtime.worker import Worker
from ..server import create_app

log = logging.getLogger("conveyor.fastapi")
Lifespan = Callable[[Starlette], AbstractAsyncContextManager[Any]]


def conveyor_lifespan(
    conveyor: Conveyor,
    *,
    prefix: str = "/conveyor",
    mount: bool = True,
    worker: bool = False,
    worker_options: Mapping[str, Any] | None = None,
    connect_wait_s: float = 30.0,
    allowed_hosts: Sequence[str] = (),
    lifespan: Lifespan | None = None,
    **server_options: Any,
) -> Lifespan:
    """A lifespan for ``FastAPI(lifespan=...)`` or ``Starlette(lifespan=...)``.

    At start: opens ``conveyor``'s database off the event loop (waiting up to
    ``connect_wait_s`` for one that does not answer yet), mounts
    ``create_app(conveyor, allowed_hosts=..., **server_options)`` at ``prefix``
    (unless ``mount=False``), starts a worker on a thread of its own if
    ``worker`` (``worker_options`` are ``Worker``'s, as ``conveyor worker``'s
    options: ``queues``, ``concurrency``, ``processes``, ``grace_s``...), then
    enters your own ``lifespan`` if given.

    At shutdown (after the server stopped taking requests): your lifespan
    exits, then the worker stops as ``conveyor worker`` does on SIGTERM: no new
    jobs, running ones get ``grace_s`` (default 30 s) to finish, the rest go back
    to the queue without using an attempt; then the database is closed.

    ``worker=True`` runs jobs in the web process: fine for a small deployment;
    run ``conveyor worker`` processes beside it when jobs are heavy or many.
    Without a worker nothing here runs Conveyor's cluster services (dead
    workers' rescue, cron): your workers do, or pass ``run_services=True``.
    """
    if mount and (not prefix.startswith("/") or prefix == "/" or prefix.endswith("/")):
        raise ConfigError(
            f"prefix must be a path like '/conveyor' (no trailing slash), got {prefix!r}"
        )
    options = dict(worker_options or {})
    if options and not worker:
        raise ConfigError("worker_options need worker=True")
    api = create_app(conveyor, allowed_hosts=allowed_hosts, **server_options) if mount else None

    @asynccontextmanager
    async def run(app: Starlette) -> AsyncIterator[Any]:
        await asyncio.to_thread(conveyor.connect, wait_s=connect_wait_s)
        if api is not None and not any(getattr(r, "app", None) is api for r in app.routes):
            app.mount(prefix, api)
        side = WorkerThread(conveyor, options) if worker else None
        try:
            if side is not None:
                await side.start()
            if lifespan is None:
                yield None
            else:
                async with lifespan(app) as state:
                    yield state
        finally:
            if side is not None:
                await side.stop()
            await asyncio.to_thread(conveyor.close)

    return run


class WorkerThread:
    """A ``Worker`` on a thread of its own (its own event loop), stopped gracefully."""

    def __init__(self, conveyor: Conveyor, options: Mapping[str, Any]) -> None:
        options = dict(options)
        if "queues" not in options:
            queues = sorted({t.defaults.queue for t in user_tasks(conveyor.tasks)})
            options["queues"] = queues or [conveyor.default_queue]
        self.worker = Worker(conveyor, **options)
        self.grace_s = float(options.get("grace_s", self.worker.config.grace_s))
        self._thread = threading.Thread(target=self._run, name="conveyor-worker", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.worker.run(install_signals=False)
        except BaseException as exc:
            self.error = exc
            log.exception("the in-process Conveyor worker stopped with an error")

    async def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        """Stop taking jobs; wait for running ones (at most the grace period)."""
        self.worker.stop(graceful=True)
        await asyncio.to_thread(self._thread.join, self.grace_s + 10.0)
        if self._thread.is_alive():
            log.warning("the in-process Conveyor worker did not stop within its grace period")
