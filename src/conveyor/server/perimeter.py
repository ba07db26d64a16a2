"""What a browser may do to the server, checked before any route runs.

- **Host**: a request must name this server. Without it, DNS rebinding (a page on
  ``attacker.example`` whose name then resolves to 127.0.0.1) gives that page the
  whole API of an open server on loopback. Loopback names (``localhost``,
  ``127.x.x.x``, ``[::1]``, any port) are always served; other names only when
  given (``--allowed-host``): ``name``, ``.name`` (it and its subdomains) or ``*``
  (any). Unknown names get 400. The probes (``GET /healthz``, ``/readyz``) answer
  any Host: they need no token either, and load balancers call them by address.
- **Cross-site writes**: a request that may change something (any method but
  GET, HEAD, OPTIONS) is refused with 403 when the browser says it comes from
  another origin: ``Sec-Fetch-Site: cross-site`` or ``same-site`` (another port
  of the same host is the same site, and SameSite cookies go with it), or, from a
  browser that does not send that header, an ``Origin`` that is not this
  server's. A plain HTML form needs no script and no CORS, so without this any
  page could pause a queue on an open server, or sign a browser in or out.
  Clients that are not browsers (curl, the SDKs, remote workers) send neither
  header and are not affected.
- **Headers** on every answer: ``X-Content-Type-Options: nosniff``,
  ``X-Frame-Options: DENY``, ``Referrer-Policy: same-origin`` and a
  Content-Security-Policy that allows only this server's own scripts, styles and
  connections and no framing (the dashboard loads nothing else); the interactive
  API docs (``/docs``, ``/redoc``: FastAPI's pages, which load from a CDN) get
  only ``frame-ancestors 'none'``.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .context import is_loopback

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PROBES = frozenset({"/healthz", "/readyz"})
#: the dashboard's policy: its own files only, nothing inline, never in a frame
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
DOCS_CSP = "frame-ancestors 'none'"
HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # not no-referrer: under it browsers send "Origin: null" with the pages' own form posts
    (b"referrer-policy", b"same-origin"),
]


def host_name(value: str) -> str | None:
    """The name in a Host header (or a URL's netloc), lower-case, without port or
    IPv6 brackets; ``None`` if it is not one."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not (rest[:1] == ":" and rest[1:].isdigit())):
            return None
        try:
            return ipaddress.ip_address(name).compressed
        except ValueError:
            return None
    name, colon, port = value.partition(":")
    if colon and not port.isdigit():
        return None
    name = name.rstrip(".")
    return name or None


def allowed_host(entry: str) -> str:
    """An ``--allowed-host`` value, checked and normalised; raises ``ValueError``."""
    text = entry.strip().lower()
    if text == "*":
        return text
    try:
        return ipaddress.ip_address(text.strip("[]")).compressed
    except ValueError:
        pass  # a name
    if text.startswith("*."):
        text = text[1:]  # *.example.com: the same as .example.com
    dot = "." if text.startswith(".") else ""
    name = host_name(text[len(dot) :])
    bare = text[len(dot) :].strip("[]")
    if name is None or name != bare or "/" in name or "*" in name or " " in name:
        raise ValueError(
            f"{entry!r} is not a host name: give it without scheme or port, e.g. "
            "queue.example.com, .example.com (it and its subdomains) or * (any)"
        )
    return dot + name


class Perimeter:
    """The Host check, the cross-site check and the security headers (see module)."""

    def __init__(
        self,
        app: ASGIApp,
        allowed_hosts: Iterable[str] = (),
        docs_paths: Iterable[str | None] = (),
    ) -> None:
        self.app = app
        self.allowed = tuple(allowed_host(h) for h in allowed_hosts)
        self.docs_paths = frozenset(p for p in docs_paths if p)

    def serves(self, name: str) -> bool:
        """Whether ``name`` (from a Host header) is one of this server's names."""
        if is_loopback(name):
            return True
        for entry in self.allowed:
            if entry == "*" or entry == name:
                return True
            if entry.startswith(".") and (name == entry[1:] or name.endswith(entry)):
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        method = scope["method"]
        path = _local_path(scope)
        host = headers.get("host")
        if host is not None and not (method in ("GET", "HEAD") and path in PROBES):
            name = host_name(host)
            if name is None or not self.serves(name):
                await _refuse(send, 400, _unknown_host(host))
                return
        if method not in SAFE_METHODS:
            why = self.foreign(headers)
            if why is not None:
                await _refuse(send, 403, why)
                return
        policy = (DOCS_CSP if path in self.docs_paths else CSP).encode()

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in HEADERS if k not in present]
                if b"content-security-policy" not in present:
                    extra.append((b"content-security-policy", policy))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)

    def foreign(self, headers: dict[str, str]) -> str | None:
        """Why a browser's write comes from another origin, or ``None``.

        ``Sec-Fetch-Site`` is the browser's own verdict (no page can set it), so it
        decides when present: ``same-origin`` or ``none`` (the user's own action)
        pass, even with ``Origin: null`` (sent for some same-origin requests, e.g.
        under a ``no-referrer`` policy). Browsers without it are judged by
        ``Origin``, which must then be this server's."""
        site = headers.get("sec-fetch-site", "").strip().lower()
        if site:
            if site in ("same-origin", "none"):
                return None
            return _cross_site(f"Sec-Fetch-Site: {site}")
        origin = headers.get("origin")
        if origin is not None and not self._own_origin(origin, headers.get("host")):
            return _cross_site(f"from the page at {origin!r}")
        return None

    def _own_origin(self, origin: str, host: str | None) -> bool:
        """The page's origin is this server: the same host and port as the request
        names (the scheme is not compared, so TLS ended by a proxy in front works),
        or a name given exactly with ``--allowed-host`` (not a wildcard)."""
        try:
            netloc = urlsplit(origin.strip()).netloc.lower()
        except ValueError:
            return False
        if not netloc:
            return False  # "null": a sandboxed frame, a data: or file: page
        if host is not None and netloc == host.strip().lower():
            return True
        name = host_name(netloc)
        return name is not None and name in self.allowed


def _local_path(scope: Scope) -> str:
    """The path inside this app (under a mount, without the mount's prefix)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _unknown_host(host: str) -> str:
    return (
        f"this server does not answer to the Host {host[:100]!r}: it serves loopback names "
        "(localhost, 127.0.0.1, [::1]) and the names given with --allowed-host (or "
        "create_app(allowed_hosts=...)). A page whose name was pointed at this address "
        "(DNS rebinding) is refused this way"
    )


def _cross_site(how: str) -> str:
    return (
        f"a browser request from another site cannot change anything here ({how}): use "
        "this server's own pages, or an API client with `Authorization: Bearer <token>`. "
        "Behind a proxy, pass the Host header through or name the public host with "
        "--allowed-host"
    )


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *HEADERS,
        (b"content-security-policy", CSP.encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
