"""PostgreSQL wake-ups: LISTEN on a connection of its own, or, behind a
transaction pooler without a direct URL, polling the change stamps."""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from ...errors import DatabaseUnavailable
from ..interfaces import Notifier
from .session import _network_defaults, _readable, redact

log = logging.getLogger("conveyor.postgres")


class PostgresNotifier(Notifier):
    """LISTEN on a dedicated connection; payloads are hints (queue names, ...).

    When the connection breaks (a server restart, a cut network), or cannot be
    made at all when the notifier is made, it reconnects with the full URL,
    password included, backing off with jitter up to 10 s, and logs the outage
    once and the recovery once. Meanwhile workers poll.

    ``close`` ends a ``wait`` at once (a byte on a socket pair the wait also
    watches), so a worker stops without sitting out the listener's timeout (0.5 of
    a `conveyor worker --burst`'s 0.9 s on an empty queue)."""

    def __init__(self, url: str, *channels: str) -> None:
        self._url = url
        self._channels = channels
        self._lock = threading.Lock()
        self._closed = False
        self._woken, self._waker = socket.socketpair()
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._backoff = 0.1
        self._conn: psycopg.Connection[Any] | None = None
        try:
            self._conn = self._connect()
        except psycopg.OperationalError as exc:
            # The server went away between the backend's first connection (which
            # reported a wrong URL or password) and this one, say a restart while
            # a worker starts: poll until it is back, as after any lost connection.
            self._lost(exc)

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            self._url, autocommit=True, connect_timeout=5, **_network_defaults(self._url)
        )
        for channel in self._channels:
            conn.execute(f"LISTEN {channel}")
        return conn

    def wait(self, timeout: float) -> set[str]:
        queues: set[str] = set()
        with self._lock:
            if self._closed:
                return queues
            if self._conn is None:
                return self._reconnect(timeout)
            try:
                # What arrived already (libpq may hold it read), else wait for the
                # socket or for close(); then everything that arrived, at once.
                for note in self._conn.notifies(timeout=0.0):
                    queues.add(note.payload)
                if not queues:
                    _readable([self._conn.fileno(), self._woken.fileno()], timeout)
                    if self._closed:
                        return queues
                    for note in self._conn.notifies(timeout=0.0):
                        queues.add(note.payload)
            except psycopg.OperationalError as exc:
                if self._closed:
                    return queues
                self._lost(exc)
                return {"*"}  # anything may have happened meanwhile
        return queues

    def _lost(self, exc: Exception) -> None:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning(
            "LISTEN connection to %s lost (%s); polling until it is back", redact(self._url), first
        )
        self._down_since = time.monotonic()
        self._backoff = 0.1
        self._retry_at = 0.0
        try:
            if self._conn is not None:
                self._conn.close()
        except Exception:
            pass
        self._conn = None

    def _reconnect(self, timeout: float) -> set[str]:
        """One attempt when its time has come; otherwise sleep out the timeout."""
        wait = self._retry_at - time.monotonic()
        if wait > 0:
            _readable([self._woken.fileno()], min(wait, timeout))  # or until close()
            return set()
        try:
            self._conn = self._connect()
        except psycopg.OperationalError:
            self._backoff = min(self._backoff * 2, 10.0)
            self._retry_at = time.monotonic() + self._backoff * random.uniform(0.5, 1.0)
            return set()
        down = time.monotonic() - (self._down_since or time.monotonic())
        log.warning("LISTEN connection to %s is back after %.1fs", redact(self._url), down)
        self._down_since = None
        return {"*"}

    def close(self) -> None:
        # Never close the connection under a thread blocked in notifies() on it:
        # libpq would use freed memory. wait() holds the lock and returns within
        # its timeout (or at once, woken here), so taking the lock is enough.
        self._closed = True
        try:
            self._waker.send(b"x")
        except OSError:
            pass  # closed twice
        with self._lock:
            try:
                if self._conn is not None:
                    self._conn.close()
            except Exception:
                pass
            self._woken.close()
            self._waker.close()


class PostgresPollingNotifier(Notifier):
    """Hints without LISTEN, which a transaction pooler cannot carry (its sessions
    are lent out a transaction at a time; a notification arrives on whichever is
    listening, never to the client that asked): the newest change stamps
    (change_stamp) polled every ``fast`` seconds while they move, backing off to
    ``slow`` when idle. A moved stamp is ``"*"``: anything may have changed."""

    def __init__(
        self, stamp: Callable[[], tuple[Any, ...]], fast: float = 0.05, slow: float = 0.2
    ) -> None:
        self._stamp = stamp
        self._fast, self._slow = fast, slow
        self._interval = fast
        self._closed = threading.Event()
        self._last = self._poll()

    def _poll(self) -> tuple[Any, ...] | None:
        try:
            return self._stamp()
        except (DatabaseUnavailable, psycopg.Error):
            return None  # the next poll tries again; meanwhile everything polls anyway

    def wait(self, timeout: float) -> set[str]:
        deadline = time.monotonic() + timeout
        while not self._closed.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed.wait(min(self._interval, remaining)):
                break
            stamp = self._poll()
            if stamp is not None and stamp != self._last:
                self._last, self._interval = stamp, self._fast
                return {"*"}
            self._interval = min(self._interval * 2, self._slow)
        return set()

    def close(self) -> None:
        self._closed.set()
