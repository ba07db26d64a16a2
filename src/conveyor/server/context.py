"""What every route of one server shares: the façade and the server's policy."""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from ..app import Conveyor

#: request bodies larger than this get 413 (``--max-body-bytes``)
DEFAULT_MAX_BODY = 10 << 20

T = TypeVar("T")


@dataclass
class ServerContext:
    """The façade and the server's policy."""

    conveyor: Conveyor
    #: None: tokens are required once any was ever created, even if all are revoked
    #: since (until then the server is open, to loopback clients only); True:
    #: always; False: never (an auth proxy in front)
    tokens_required: bool | None = None
    #: with ``tokens_required=None``: open again (to loopback clients) while no token
    #: is active, as an operator asked on purpose (``conveyor server --open``)
    reopen: bool = False
    #: Host names served besides the loopback ones (see ``perimeter``)
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY
    #: the longest a lease request may wait for work (wait_s)
    max_wait_s: float = 30.0
    #: a remote worker silent this long is dead (its jobs are rescued)
    worker_ttl_s: float = 7.0
    #: the worker id asyncflow's hold_task claims under, and its deadline when the
    #: task type sets no max_processing_s
    asyncflow_worker: str = "asyncflow"
    asyncflow_deadline_s: float = 30.0
    _parts: dict[Callable[..., Any], Any] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _parts_lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    def closed(self) -> bool:
        """Whether a request needs a valid token (a blocking read, cached a few seconds)."""
        if self.tokens_required is not None:
            return self.tokens_required
        if self.reopen:
            return self.conveyor.serving.tokens_active()
        return self.conveyor.serving.tokens_configured()

    def part(self, make: Callable[[ServerContext], T]) -> T:
        """This server's one ``make(self)``, made on first use: what routes keep
        between requests (the readiness check, the metrics registry, the
        dashboard's history) lives as long as the server, not the module."""
        with self._parts_lock:  # two first requests at once must not make two
            if make not in self._parts:
                self._parts[make] = make(self)
            return cast(T, self._parts[make])


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
