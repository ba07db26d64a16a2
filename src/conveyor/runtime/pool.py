"""A fixed pool of daemon threads for sync handlers.

concurrent.futures joins its threads at interpreter exit, so one sync handler
stuck past its timeout would keep a stopped worker alive forever. Its job has
been released or failed by then (and its late result will be refused by
fencing), so the thread is safe to abandon: daemon threads allow that.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_STOP = object()


class DaemonPool:
    def __init__(self, size: int, name: str = "conveyor-sync") -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            fut, fn = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        fut: Future[Any] = Future()
        self._q.put((fut, fn))
        return fut

    def shutdown(self) -> None:
        for _ in self._threads:
            self._q.put(_STOP)
