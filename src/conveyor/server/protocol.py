"""uvicorn's HTTP/1.1 protocol (h11) with a deadline on reading a request's head.

uvicorn has none: a connection that sends nothing, or a request line and then a
header byte now and then (slowloris), is kept open for as long as the client
likes, so a few hundred such sockets hold the server's file descriptors and
memory. Its ``timeout_keep_alive`` only covers the wait *between* requests, and
ends as soon as one byte arrives. Here a request's head (request line and
headers) must be complete within ``head_timeout_s`` of the connection opening or
of its first byte after a response; else the connection is closed. A slow body,
or a long response (an event stream), is not limited by it.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("conveyor.server")


class HeadDeadline(H11Protocol):
    """``H11Protocol`` that closes a connection whose request head is late."""

    head_timeout_s: float = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    @classmethod
    def with_timeout(cls, seconds: float) -> type[HeadDeadline]:
        """This protocol with its own deadline (uvicorn takes a class, not an instance)."""
        return type(cls.__name__, (cls,), {"head_timeout_s": seconds})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._reading_head():
            if self._head_timer is None:
                self._arm()  # the first byte of a request after a keep-alive wait
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._reading_head() and self.conn.trailing_data[0]:
            if self._head_timer is None:
                self._arm()  # part of the next request's head came with this one
        else:
            self._disarm()  # silence until the next request: uvicorn's keep-alive timer

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _reading_head(self) -> bool:
        return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _late(self) -> None:
        self._head_timer = None
        if self._reading_head():
            log.debug("closing %s: no request head in %gs", self.client, self.head_timeout_s)
            self.transport.close()
