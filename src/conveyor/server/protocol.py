"""uvicorn's HTTP/1.1 protocol (h11) with a deadline on reading a request's head.

uvicorn has none: a connection that sends nothing, or a request line and then a
header byte now and then (slowloris), is kept open for as long as the client
likes, so a few hundred such sockets hold the server's file descriptors and
memory. Its ``timeout_keep_alive`` only covers the wait *between* requests, and
ends as soon as one byte arrives. Here a request's head (request line and
headers) must be complete within ``head_timeout_s`` of the connection opening or
of its first byte after a response; else the connection is closed. A slow body,
or a long response (an event stream), is not limited by it.

And a request h11 refuses (a head past ``h11_max_incomplete_event_size``, 16 KiB;
a malformed line) gets the status h11 gives (431 for the head, else 400; uvicorn
says 400 to all), answered as nginx's ``lingering_close`` does: uvicorn closed
at once with the rest of the request unread, so the kernel reset the connection
and the client lost the answer with it. Here the answer goes out, the write side
is shut, and what still comes is read and dropped for ``LINGER_S`` at most.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("conveyor.server")

#: how long the rest of a refused request is read (and dropped) before closing
LINGER_S = 2.0


class _Refusing(h11.Connection):
    """An h11 connection that remembers why it refused the request (uvicorn only
    learns that it did)."""

    refused: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refused = exc
            raise


class HeadDeadline(H11Protocol):
    """``H11Protocol`` that closes a connection whose request head is late."""

    head_timeout_s: float = 10.0
    _head_timer: asyncio.TimerHandle | None = None
    #: a refused request was answered: what still comes is dropped
    _lingering = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn's connection as uvicorn makes it, but keeping h11's reason
        limit = self.config.h11_max_incomplete_event_size
        sized = {} if limit is None else {"max_incomplete_event_size": limit}
        self.conn = _Refusing(h11.SERVER, **sized)

    @classmethod
    def with_timeout(cls, seconds: float) -> type[HeadDeadline]:
        """This protocol with its own deadline (uvicorn takes a class, not an instance)."""
        return type(cls.__name__, (cls,), {"head_timeout_s": seconds})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the rest of a refused request
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

    def send_400_response(self, msg: str) -> None:
        refused = self.conn.refused if isinstance(self.conn, _Refusing) else None
        status = HTTPStatus(refused.error_status_hint if refused else 400)
        text = status.phrase if status != 400 else msg
        log.debug("refusing a request from %s: %s", self.client, refused or msg)
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        for event in (
            h11.Response(status_code=status, headers=headers, reason=status.phrase),
            h11.Data(data=text.encode()),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self._lingering = True
        self._disarm()
        self.transport.write_eof()  # the client reads the answer, then closes
        self.loop.call_later(LINGER_S, self.transport.close)

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
