"""Conveyor over HTTP: an ASGI app (FastAPI) thin over the façade.

``create_app(conveyor_app)`` returns it; ``conveyor server`` serves it with
uvicorn; a FastAPI or Starlette app can mount it (``parent.mount("/q", app)``).
"""

from .app import ROUTERS, ServerContext, create_app, is_loopback

__all__ = ["ROUTERS", "ServerContext", "create_app", "is_loopback"]
