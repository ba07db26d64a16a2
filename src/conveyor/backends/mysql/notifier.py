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
    stamp, every ``fast`` seconds while changes keep coming, backing off to
    ``slow`` when idle. Stamps that do not move (a flag set, a late commit of an
    older stamp) are left to the worker's own polling."""

    def __init__(
        self,
        connect: Callable[[], pymysql.connections.Connection[Any]],
        hub_key: str,
        fast: float = 0.02,
        slow: float = 0.25,
    ) -> None:
        self._connect = connect
        self._fast, self._slow = fast, slow
        self._interval = fast
        self._event = threading.Event()
        self._hints: set[str] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._conn: pymysql.connections.Connection[Any] | None = None
        self._last: tuple[Any, Any] | None = None
        HUB.add(hub_key, self)
        self._last = self._poll()

    def hint(self, hints: set[str]) -> None:
        with self._lock:
            self._hints |= hints
        self._event.set()

    def _poll(self) -> tuple[Any, Any] | None:
        try:
            if self._conn is None:
                self._conn = self._connect()
            with self._conn.cursor() as cur:
                cur.execute(Q["max_change"])
                row = cur.fetchone()
            return (row["jobs"], row["batches"])
        except pymysql.Error:
            conn, self._conn = self._conn, None
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass
            return None

    def wait(self, timeout: float) -> set[str]:
        deadline = time.monotonic() + timeout
        while not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return set()
            if self._event.wait(min(self._interval, remaining)):
                with self._lock:
                    hints, self._hints = self._hints, set()
                    self._event.clear()
                if hints:
                    self._interval = self._fast
                    return hints
                continue
            if self._closed:
                break
            stamp = self._poll()
            if stamp is not None and stamp != self._last:
                self._last = stamp
                self._interval = self._fast
                return {"*"}
            self._interval = min(self._interval * 2, self._slow)
        return set()

    def close(self) -> None:
        self._closed = True
        self._event.set()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
