"""What every route of one server shares: the façade and the server's policy."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..app import Conveyor

#: request bodies larger than this get 413 (``--max-body-bytes``)
DEFAULT_MAX_BODY = 10 << 20


@dataclass
class ServerContext:
    """The façade and the server's policy."""

    conveyor: Conveyor
    #: None: tokens are required once any exists (and the server is open to loopback
    #: clients only until then); True: always; False: never (an auth proxy in front)
    tokens_required: bool | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY
    #: the longest a lease request may wait for work (wait_s)
    max_wait_s: float = 30.0
    #: a remote worker silent this long is dead (its jobs are rescued)
    worker_ttl_s: float = 7.0
    #: the worker id asyncflow's hold_task claims under, and its deadline when the
    #: task type sets no max_processing_s
    asyncflow_worker: str = "asyncflow"
    asyncflow_deadline_s: float = 30.0


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
