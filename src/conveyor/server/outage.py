"""While the database is down the server answers at once. A request waits at
most ``REQUEST_WAIT_S`` for a database connection (the backends' own wait, 30 s,
is the workers', which retry), and its 503 says when to try again
(``Retry-After``). Why it failed, with the database's host, port and user, goes
to the server's log only: clients, ``/readyz``'s unauthenticated ones among
them, learn that the database is unavailable, never where it is."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from ..app import Conveyor

#: the longest a request waits for a database connection
REQUEST_WAIT_S = 1.5
#: the longest /readyz's check waits for one, and /readyz for its check
READY_WAIT_S = 0.5
READY_DEADLINE_S = 0.8
#: what a 503 tells the client to wait before it tries again
RETRY_AFTER_S = 5
#: a 503's body, by the kind of error: nothing about where the database is
UNAVAILABLE = "the database is unavailable; try again later"
SCHEMA_MISMATCH = "the database's schema does not match this server's; try again later"


class BoundedWaits:
    """Every HTTP request's database calls wait at most ``seconds`` for a
    connection (``Serving.bounded_waits``); the server's own threads, started
    outside requests (the cluster's services), wait as they always did."""

    def __init__(self, app: ASGIApp, conveyor: Conveyor, seconds: float = REQUEST_WAIT_S) -> None:
        self.app = app
        self.conveyor = conveyor
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with self.conveyor.serving.bounded_waits(self.seconds):
            await self.app(scope, receive, send)
