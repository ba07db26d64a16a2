"""MySQL wake-ups, without LISTEN: a commit wakes this process's notifiers at
once (the hub), and changes other processes commit are noticed by polling."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pymysql

from ..interfaces import Notifier
from .dialect import Q


class _Hub:
    """Wake-ups inside one process: a commit that made work wakes this process's
    notifiers of the same database at once (other processes poll)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._notifiers: dict[str, weakref.WeakSet[MySQLNotifier]] = {}

    def add(self, key: str, notifier: MySQLNotifier) -> None:
        with self._lock:
            self._notifiers.setdefault(key, weakref.WeakSet()).add(notifier)

    def fire(self, key: str, hints: set[str]) -> None:
        with self._lock:
            targets = list(self._notifiers.get(key, ()))
        for n in targets:
            n.hint(hints)


HUB = _Hub()


class MySQLNotifier(Notifier):
    """No LISTEN on MySQL: hints from this process arrive at once (the hub), and
    changes committed by other processes are noticed by polling the largest change
    stamp (two index descents). Every ``fast`` seconds (2 ms) while stamps moved
    within the last ``linger`` seconds (5 s), so a worker that was just busy
    notices a job sent to it within a few milliseconds; then less and less often,
    down to every ``slow`` seconds (250 ms) when idle. While its consumer is busy
    (``pace(False)``: a worker claiming full batches, which claims again without a
    hint) every ``busy`` seconds (50 ms), and at once when it waits again.

    The cost to the database: about 500 polls a second per worker for ``linger``
    seconds after the last change it saw, 4 a second once idle. Stamps that do not
    move (a flag set, a late commit of an older stamp) are left to the worker's own
    polling."""

    def __init__(
        self,
        connect: Callable[[], Any],
        hub_key: str,
        fast: float = 0.002,
        slow: float = 0.25,
        linger: float = 5.0,
        busy: float = 0.05,
        error: type[Exception] = pymysql.Error,
    ) -> None:
        self._connect = connect
        self._error = error  # the driver's
        self._fast, self._slow, self._linger, self._busy = fast, slow, linger, busy
        self._interval = fast
        self._changed_at = time.monotonic()
        self._event = threading.Event()
        self._hints: set[str] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._eager = True
        self._conn: Any = None
        #: a poll is on the connection: close() leaves the connection to the poll
        #: to close when it returns (a close under a poll raised PyMySQL's
        #: AttributeError out of wait(); waiting for the poll could hang a
        #: worker's stop on a cut network)
        self._polling = False
        self._conn_lock = threading.Lock()
        self._last: tuple[Any, Any] | None = None
        HUB.add(hub_key, self)
        self._last = self._poll()

    def hint(self, hints: set[str]) -> None:
        with self._lock:
            self._hints |= hints
        self._event.set()

    def pace(self, eager: bool) -> None:
        was, self._eager = self._eager, eager
        if eager and not was:
            self._event.set()  # wakes a busy wait: the next poll is now

    def _poll(self) -> tuple[Any, Any] | None:
        with self._conn_lock:
            if self._closed:
                return None
            self._polling = True
        try:
            return self._poll_once()
        finally:
            with self._conn_lock:
                self._polling = False
                left = self._take_if_closed()
            close_quietly(left)

    def _take_if_closed(self) -> Any:
        if not self._closed:
            return None
        conn, self._conn = self._conn, None
        return conn

    def _poll_once(self) -> tuple[Any, Any] | None:
        try:
            if self._conn is None:
                self._conn = self._connect()
            with self._conn.cursor() as cur:
                cur.execute(Q["max_change"])
                row = cur.fetchone()
            return (row["jobs"], row["batches"])
        except self._error:
            conn, self._conn = self._conn, None
            close_quietly(conn)
            return None

    def _pause(self, now: float) -> float:
        """How long to wait before the next poll."""
        if not self._eager:
            return self._busy
        if now - self._changed_at < self._linger:
            self._interval = self._fast
        else:
            self._interval = min(self._interval * 2, self._slow)
        return self._interval

    def wait(self, timeout: float) -> set[str]:
        deadline = time.monotonic() + timeout
        while not self._closed:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return set()
            if self._event.wait(min(self._pause(now), remaining)):
                with self._lock:
                    hints, self._hints = self._hints, set()
                    self._event.clear()
                if hints:
                    self._changed_at = time.monotonic()
                    return hints
                if self._closed:
                    break
            stamp = self._poll()
            if stamp is not None and stamp != self._last:
                self._last = stamp
                self._changed_at = time.monotonic()
                return {"*"}
        return set()

    def close(self) -> None:
        self._closed = True
        self._event.set()
        with self._conn_lock:
            left = None if self._polling else self._take_if_closed()
        close_quietly(left)


def close_quietly(conn: Any) -> None:
    """Closes ``conn`` (if any), whatever state its socket is in."""
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass
