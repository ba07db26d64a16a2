"""Connections held one per thread, handed on when their thread ends.

SQLite and MySQL backends give each thread a connection of its own (PostgreSQL's
come from a pool). Kept until the backend closed, a program whose threads come
and go (a web server's thread per request, a thread per upload) held one more
connection for every thread it ever ran: MySQL's ``max_connections`` or the
process's file descriptors ran out. Here a thread that needs a connection first
takes over one whose thread has ended, once ``reset`` says it is fit to use (its
transaction, if one was left open, rolled back); a new one is made only when none
is free. A program holds one connection per live thread that used the backend.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

C = TypeVar("C")


class ThreadConnections(Generic[C]):
    def __init__(self, reset: Callable[[C], bool], close: Callable[[C], None]) -> None:
        #: makes a dead thread's connection fit for another; False: it is not
        self._reset = reset
        #: closes a connection, quietly
        self._close = close
        self._forget()

    def _forget(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        #: every connection held, by id, with the thread that holds it
        self._held: dict[int, tuple[C, threading.Thread]] = {}

    def mine(self) -> C | None:
        """This thread's connection, or one an ended thread left (reset), or None."""
        conn: C | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._adopt()
        return conn

    def _adopt(self) -> C | None:
        me = threading.current_thread()
        while True:
            with self._lock:
                left = next((c for c, t in self._held.values() if not t.is_alive()), None)
                if left is None:
                    return None
                self._held[id(left)] = (left, me)  # no other thread can take it now
            fit = False
            try:
                fit = self._reset(left)
            finally:
                if not fit:
                    with self._lock:
                        self._held.pop(id(left), None)
                    self._close(left)
            if fit:
                self._local.conn = left
                return left

    def add(self, conn: C) -> C:
        """``conn``, new, is this thread's from now on."""
        with self._lock:
            self._held[id(conn)] = (conn, threading.current_thread())
        self._local.conn = conn
        return conn

    def discard(self) -> None:
        """This thread's connection, closed (after an error on it)."""
        conn: C | None = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with self._lock:
                self._held.pop(id(conn), None)
            self._close(conn)

    def close_all(self) -> None:
        """Every connection held, closed: at once where no thread can be in a call
        on it (the caller's, and those of ended threads). Another live thread may
        be: closing a SQLite connection there crashed the process (the C library
        went on with the freed connection). Such a connection is let go instead,
        and closed when its thread drops it, at the end of the call it is in (or
        at once, by the garbage collector, if it is in none)."""
        me = threading.current_thread()
        with self._lock:
            idle = [c for c, t in self._held.values() if t is me or not t.is_alive()]
            self._held = {}
        self._local = threading.local()  # (the other threads' references go with it)
        for conn in idle:
            self._close(conn)

    def after_fork(self) -> list[C]:
        """In a forked child: the parent's connections, forgotten (not closed).
        Without the lock, which a parent's thread may have held at the fork: the
        child has one thread."""
        left = [c for c, _t in self._held.values()]
        self._forget()
        return left

    def __len__(self) -> int:
        return len(self._held)
