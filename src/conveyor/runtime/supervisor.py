"""Handlers in child processes, under a parent that holds the jobs.

``conveyor worker --processes N``: the parent claims, heartbeats and writes
outcomes, as always; each job runs in one of N child processes, one job at a
time per child. Whatever a handler does to its process (a segfault,
``os.abort()``, ``sys.exit()``, an out-of-memory kill) fails that attempt with
the exit code or signal named, the child is replaced, and the other jobs go on:
the parent never dies with its children. A job past its timeout, cancelled, or
whose child grows past ``--max-memory``, is really stopped: its child is killed.

Use it for CPU-bound handlers, for code that may crash or leak, and for sync
handlers whose timeouts must be enforced. The default in-process mode (async
handlers on the event loop, sync ones on threads) costs less per job and suits
I/O-bound work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from ..errors import ConveyorError, JobTimeout
from ..records import JobRecord
from ..task import Task
from .context import CancelFlag
from .executor import Run, _resolve, describe, format_traceback

log = logging.getLogger("conveyor.worker")


class HandlerCrashed(ConveyorError):
    """The process running the handler died before it returned."""


class RemoteError(Exception):
    """An exception raised in a child process that could not be sent as itself."""


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "it is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with status {code}"


class Child:
    """One child process and the pipe to it."""

    def __init__(self, ctx: Any, app_spec: str, url: str) -> None:
        parent, child = ctx.Pipe()
        self.conn: Connection = parent
        self.proc = ctx.Process(
            target=child_main,
            args=(app_spec, url, child, list(sys.path)),
            name="conveyor-handler",
            daemon=True,
        )
        self.proc.start()
        child.close()
        self.killed_because: str | None = None

    def rss_mb(self) -> float | None:
        try:
            with open(f"/proc/{self.proc.pid}/statm") as f:
                pages = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)

    def kill(self, why: str) -> None:
        if self.killed_because is None:
            self.killed_because = why
        with contextlib.suppress(Exception):
            self.proc.kill()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(2)


class ProcessPool:
    """The executor of ``--processes``: one job per child at a time."""

    def __init__(
        self, app_spec: str, size: int, *, url: str, max_memory_mb: float | None = None
    ) -> None:
        self.app_spec = app_spec
        self.size = size
        self.url = url
        self.max_memory_mb = max_memory_mb
        self._ctx = multiprocessing.get_context("spawn")
        self._idle: list[Child] = []
        self._all: set[Child] = set()
        self._sem: asyncio.Semaphore | None = None
        self._closed = False

    async def _acquire(self) -> Child:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.size)
        await self._sem.acquire()
        while self._idle:
            child = self._idle.pop()
            if child.proc.is_alive():
                return child
            self._forget(child)
        child = await asyncio.to_thread(Child, self._ctx, self.app_spec, self.url)
        self._all.add(child)
        return child

    def _release(self, child: Child, healthy: bool) -> None:
        if healthy and not self._closed:
            self._idle.append(child)
        else:
            self._forget(child)
        assert self._sem is not None
        self._sem.release()

    def _forget(self, child: Child) -> None:
        self._all.discard(child)
        threading.Thread(target=child.close, daemon=True).start()

    async def invoke(self, task: Task, job: JobRecord, cancel: CancelFlag | None, run: Run) -> Any:
        child = await self._acquire()
        healthy = False
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()

        def receive() -> None:
            try:
                message = child.conn.recv()
            except BaseException as exc:  # EOF: the child died
                message = ("died", exc)
            loop.call_soon_threadsafe(_resolve, reply, message)

        try:
            child.conn.send(job)
            run.started = time.monotonic()
            threading.Thread(target=receive, name="conveyor-child-recv", daemon=True).start()
            watch = asyncio.create_task(self._watch_memory(child, job))
            try:
                async with asyncio.timeout(job.timeout):
                    kind, value = await reply
            except TimeoutError:
                child.kill("timeout")
                raise JobTimeout(
                    f"{task.name} exceeded its {job.timeout:g}s timeout; its process was killed"
                ) from None
            finally:
                watch.cancel()
            if kind == "died":
                await asyncio.to_thread(child.proc.join, 2)
                why = child.killed_because or _describe_exit(child.proc.exitcode)
                raise HandlerCrashed(
                    f"the process running {task.name} (pid {child.proc.pid}) died: {why}; "
                    "another process takes the next job"
                )
            healthy = True
            if kind == "error":
                raise value
            return value
        except asyncio.CancelledError:
            child.kill("stopped: its job was lost, cancelled or released")  # really stop it
            raise
        finally:
            self._release(child, healthy)

    async def _watch_memory(self, child: Child, job: JobRecord) -> None:
        if self.max_memory_mb is None:
            return
        while True:
            await asyncio.sleep(0.25)
            rss = child.rss_mb()
            if rss is not None and rss > self.max_memory_mb:
                log.error(
                    "job %d (%s): its process uses %.0f MB, over --max-memory %g MB; killing it",
                    job.id,
                    job.task,
                    rss,
                    self.max_memory_mb,
                )
                child.kill(
                    f"killed: its memory grew to {rss:.0f} MB, over the {self.max_memory_mb:g} MB "
                    "limit (--max-memory)"
                )
                return

    def shutdown(self) -> None:
        self._closed = True
        for child in list(self._all):
            child.close()
        self._all.clear()
        self._idle.clear()


# -- in the child --------------------------------------------------------------------------
def child_main(app_spec: str, url: str, conn: Connection, path: list[str]) -> None:
    """Import the app, then run one job per message until the pipe closes."""
    sys.path[:] = path
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from ..durable import _store
    from ..loading import load_app
    from .context import _current

    app = load_app(app_spec)
    app.url = url
    _store.set(lambda: app.backend)  # durable steps: this process's own connection
    loop = asyncio.new_event_loop()
    while True:
        try:
            job: JobRecord = conn.recv()
        except (EOFError, OSError):
            return
        task = app.tasks.get(job.task)
        token = _current.set(job)
        try:
            if task is None:
                raise LookupError(f"no task named {job.task!r} in {app_spec}")
            if task.is_async:
                result = loop.run_until_complete(task.fn(*job.args, **job.kwargs))
            else:
                result = task.fn(*job.args, **job.kwargs)
            message: tuple[str, Any] = ("ok", result)
        except BaseException as exc:
            message = ("error", _sendable(exc))
        finally:
            _current.reset(token)
        try:
            conn.send(message)
        except Exception as exc:  # a result pickle cannot carry
            conn.send(("error", TypeError(f"the handler's result cannot leave its process: {exc}")))


def _sendable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RemoteError with its
    type and message; either way, carrying the child's traceback as a note."""
    tb = format_traceback(exc)
    copy: BaseException
    try:
        copy = pickle.loads(pickle.dumps(exc))
    except Exception:
        copy = RemoteError(describe(exc))
    copy.add_note(f"in handler process {os.getpid()}:\n{tb}")
    return copy
