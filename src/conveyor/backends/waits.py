"""How long a call may wait for the database, when its caller cannot wait long:
a bound that a context sets (``Serving.bounded_waits``: a server's request
handlers) for the calls made in it and in the threads it hands them to
(``asyncio.to_thread`` and anyio copy the context), and that each backend
applies to its waits for a connection. Where no bound is set (workers, the
cluster's services, scripts), a backend waits as it always did, and a worker
retries with its backoff: a database restarting is waited for, not failed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_BOUND: ContextVar[float | None] = ContextVar("conveyor_connection_wait_s", default=None)


def connection_wait_s() -> float | None:
    """The longest this context may wait for a connection, or None (the backend's own)."""
    return _BOUND.get()


@contextmanager
def bounded(seconds: float) -> Iterator[None]:
    if not seconds > 0:
        raise ValueError(f"a wait bound is a positive number of seconds, got {seconds!r}")
    token = _BOUND.set(seconds)
    try:
        yield
    finally:
        _BOUND.reset(token)
