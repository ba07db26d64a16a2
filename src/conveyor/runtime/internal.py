"""Conveyor's own jobs (its built-in tasks, ``registry.BUILTIN_TASKS``: the bulk
actions the server starts) run by the server itself: a worker of one slot on the
``conveyor`` queue, as a service beside the cluster services, so a deployment of a
server and remote HTTP workers only still runs them (``conveyor worker --queues
conveyor`` runs them too)."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ..registry import BUILTIN_TASKS, INTERNAL_QUEUE
from ..task import Task
from .service import Health
from .worker import Worker

if TYPE_CHECKING:
    from ..app import Conveyor

log = logging.getLogger("conveyor.service")


class BuiltinTasks:
    """A worker's tasks (``TaskResolver``): Conveyor's built-in ones only, whatever
    else the app registered (the app's own tasks run on its own workers)."""

    def __init__(self, app: Conveyor) -> None:
        self.app = app

    def names(self) -> list[str] | None:
        return sorted(BUILTIN_TASKS)

    def resolve(self, name: str) -> Task | None:
        return self.app.tasks.get(name) if name in BUILTIN_TASKS else None


class InternalWorker:
    """A ``Worker`` (concurrency 1, no cluster services of its own) on the
    ``conveyor`` queue, on a thread of its own. Stopping it releases a job it
    runs after ``grace_s``: the job's next attempt goes on where it stopped."""

    name = "internal-worker"

    def __init__(self, app: Conveyor, *, worker_ttl_s: float = 7.0, grace_s: float = 5.0) -> None:
        self.worker = Worker(
            app,
            queues=(INTERNAL_QUEUE,),
            concurrency=1,
            services=False,
            worker_ttl_s=worker_ttl_s,
            grace_s=grace_s,
            task_resolver=BuiltinTasks(app),
        )
        self._grace_s = grace_s
        self._thread: threading.Thread | None = None
        self._error: str | None = None

    def start(self, wait_s: float = 10.0) -> None:
        """Start it, and wait (``wait_s`` at most) until it registered: a server
        that answers shows its worker."""
        self._thread = threading.Thread(target=self._run, name="conveyor-internal", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + wait_s
        while not self.worker.health() and self._thread.is_alive():
            if time.monotonic() > deadline:
                log.warning("the server's worker of the %r queue is slow to start", INTERNAL_QUEUE)
                return
            time.sleep(0.005)

    def _run(self) -> None:
        try:
            self.worker.run(install_signals=False)
        except Exception as exc:
            self._error = str(exc)
            log.exception("the server's worker of the %r queue stopped", INTERNAL_QUEUE)

    def stop(self, timeout: float = 5.0) -> None:
        self.worker.stop(graceful=True)
        if self._thread is not None:
            self._thread.join(self._grace_s + timeout)
            if self._thread.is_alive():
                log.warning("the server's worker of the %r queue did not stop", INTERNAL_QUEUE)

    def health(self) -> Health:
        running = self._thread is not None and self._thread.is_alive()
        return Health(self.name, running, None, self._error, 1 if self._error else 0)
