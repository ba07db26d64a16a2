"""A pool of daemon threads for sync handlers.

concurrent.futures joins its threads at interpreter exit, so one sync handler
stuck past its timeout would keep a stopped worker alive forever. Its job has
been released or failed by then (and its late result will be refused by
fencing), so the thread is safe to abandon: daemon threads allow that.
Threads start on demand, up to ``size``: a worker whose tasks are all async
never starts one.
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
        self._size = size
        self._name = name
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._lock:
            # Reserve an idle thread for this item, or start one: counting at
            # submit time means two quick submits never share one idle thread.
            if self._idle > 0:
                self._idle -= 1
                start = None
            elif len(self._threads) < self._size:
                start = threading.Thread(
                    target=self._loop, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(start)
            else:
                start = None  # all busy: the item waits for the first free thread
        self._q.put((fut, fn))
        if start is not None:
            start.start()
        return fut

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            fut, fn = item
            try:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as exc:
                        fut.set_exception(exc)
            finally:
                with self._lock:
                    self._idle += 1

    def shutdown(self) -> None:
        for _ in self._threads:
            self._q.put(_STOP)
