"""Waiting for jobs to change without polling in a tight loop.

One daemon thread per app listens for the database's change hints (PostgreSQL
NOTIFY on the events channel, SQLite's data version) and wakes every waiter,
sync or async; each waiter then reads what it waits for. Hints may be lost, so
waiters also look again at least once a second.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from .backends.interfaces import Backend, Notifier

log = logging.getLogger("conveyor.waiter")

#: the longest a waiter sleeps without a hint before it looks again
SAFETY_POLL_S = 1.0


class ChangeWaiter:
    """``events=False`` listens for work hints (new or requeued jobs) instead of
    change hints (finished jobs): what a long-polling remote worker waits for."""

    def __init__(self, backend: Callable[[], Backend], *, events: bool = True) -> None:
        self._backend = backend
        self._events = events
        self._cond = threading.Condition()
        self._generation = 0
        self._thread: threading.Thread | None = None
        self._notifier: Notifier | None = None
        self._closed = False
        self._async: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    @property
    def generation(self) -> int:
        """Moves on every hint: read it before looking, wait for it to move after."""
        self._start()
        return self._generation

    def _start(self) -> None:
        if self._thread is None and not self._closed:
            with self._cond:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="conveyor-waiter", daemon=True
                    )
                    self._thread.start()

    def _run(self) -> None:
        try:
            notifier = self._backend().notifier(events=self._events)
        except Exception as exc:  # waiters still poll
            log.warning("change hints unavailable, waiting by polling: %s", exc)
            return
        self._notifier = notifier
        try:
            while not self._closed:
                try:
                    hints = notifier.wait(0.5)
                except Exception:
                    hints = set()
                if hints:
                    self._wake()
        finally:
            notifier.close()

    def _wake(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
            waiters = list(self._async)
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:
                pass  # that loop is closed

    def wait(self, generation: int, timeout: float) -> None:
        """Block until a hint after ``generation``, or ``timeout`` (capped at the
        safety poll)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._generation != generation or self._closed,
                min(timeout, SAFETY_POLL_S),
            )

    async def await_change(self, generation: int, timeout: float) -> None:
        """``wait`` for async code: the event loop is never blocked."""
        self._start()
        event = asyncio.Event()
        key = (asyncio.get_running_loop(), event)
        with self._cond:
            if self._generation != generation:
                return
            self._async.add(key)
        try:
            async with asyncio.timeout(min(timeout, SAFETY_POLL_S)):
                await event.wait()
        except TimeoutError:
            pass
        finally:
            with self._cond:
                self._async.discard(key)

    def close(self) -> None:
        self._closed = True
        self._wake()
        notifier = self._notifier
        if notifier is not None:
            notifier.close()  # ends its wait at once: the thread need not sit it out
        if self._thread is not None:
            self._thread.join(2)
            self._thread = None
