"""A pool of daemon threads for sync handlers.

concurrent.futures joins its threads at interpreter exit, so one sync handler
stuck past its timeout would keep a stopped worker alive forever. Its job has
been released or failed by then (and its late result will be refused by
fencing), so the thread is safe to abandon: daemon threads allow that.

A thread given up on (its job timed out) no longer counts against the pool's
size: another thread starts for the next job, which then runs at once instead
of waiting, its timeout ticking, behind a job that already ended. Threads start
on demand: a worker whose tasks are all async never starts one.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

log = logging.getLogger("conveyor.worker")

_STOP = object()


class DaemonPool:
    def __init__(self, size: int, name: str = "conveyor-sync") -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._size = size
        self._name = name
        self._threads = 0  # alive
        self._idle = 0  # blocked waiting for an item
        self._pending = 0  # items queued, not yet taken
        self._abandoned: set[Future[Any]] = set()
        self._lock = threading.Lock()
        self._started = 0
        self._closed = False

    def _grow(self) -> bool:
        """Under the lock: start a thread if an item waits with no idle thread to
        take it and there is room (abandoned threads do not count)."""
        if self._pending > self._idle and self._threads < self._size + len(self._abandoned):
            self._threads += 1
            self._started += 1
            return True
        return False

    def _spawn(self) -> None:
        threading.Thread(
            target=self._loop, name=f"{self._name}-{self._started}", daemon=True
        ).start()

    def submit(
        self, fn: Callable[[], Any], on_start: Callable[[], None] | None = None
    ) -> Future[Any]:
        """Run ``fn`` on a pool thread; ``on_start()`` is called on that thread just
        before ``fn`` (a future cancelled before then never runs)."""
        fut: Future[Any] = Future()
        with self._lock:
            self._pending += 1
            start = self._grow()
        self._q.put((fut, fn, on_start))
        if start:
            self._spawn()
        return fut

    def abandon(self, fut: Future[Any]) -> None:
        """Stop counting the thread running ``fut`` (its job timed out): a job waiting
        for a thread gets a new one now."""
        with self._lock:
            if fut.done():
                return
            self._abandoned.add(fut)
            stuck = len(self._abandoned)
            start = self._grow()
        if start:
            self._spawn()
        if stuck >= self._size:
            log.warning(
                "%d sync handler thread(s) are still running jobs that timed out; a handler "
                "that ignores its timeout keeps its thread (run such tasks with --processes, "
                "where a timed-out job's process is killed)",
                stuck,
            )

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            item = self._q.get()
            with self._lock:
                self._idle -= 1
                self._pending -= 1
                if item is _STOP:
                    self._threads -= 1
                    return
            fut, fn, on_start = item
            if fut.set_running_or_notify_cancel():
                try:
                    if on_start is not None:
                        on_start()
                    fut.set_result(fn())
                except BaseException as exc:  # SystemExit and KeyboardInterrupt too
                    fut.set_exception(exc)
            with self._lock:
                if fut in self._abandoned:
                    self._abandoned.discard(fut)
                    if self._threads > self._size + len(self._abandoned):
                        self._threads -= 1
                        return  # a replacement took this thread's place

    def shutdown(self) -> None:
        """Let every thread go once it is idle (a second call changes nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            n = self._threads
            self._pending += n
        for _ in range(n):
            self._q.put(_STOP)
