"""Conveyor over HTTP: an ASGI app (FastAPI) thin over the façade.

``create_app(conveyor_app)`` returns it; ``conveyor server`` serves it with
uvicorn; a FastAPI or Starlette app can mount it (``parent.mount("/q", app)``).

The names are imported on first use: a ``conveyor worker`` that never serves
HTTP does not pay for importing FastAPI (about half a second).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import ROUTERS, ServerContext, create_app, is_loopback

__all__ = ["ROUTERS", "ServerContext", "create_app", "is_loopback"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
