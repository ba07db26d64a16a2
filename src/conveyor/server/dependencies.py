"""The dependencies every route module takes its server from: ``Ctx`` (the
``ServerContext``: the façade and the server's policy) and ``Facade`` (the
façade alone). Route handlers live at module level, in one ``APIRouter`` per
module, and ``create_app`` includes those routers in each app it makes; a
handler finds the server answering it through these."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from ..app import Conveyor
from .context import ServerContext


# async: a plain function would cost each request a trip through the thread pool
async def server_context(request: Request) -> ServerContext:
    """The context of the server answering ``request``: ``create_app`` keeps it in
    its app's state (a server mounted in another app is an app of its own)."""
    ctx = getattr(request.app.state, "conveyor", None)
    if not isinstance(ctx, ServerContext):
        raise RuntimeError("Conveyor's routes are served by the app that create_app() makes")
    return ctx


async def facade(request: Request) -> Conveyor:
    return (await server_context(request)).conveyor


Ctx = Annotated[ServerContext, Depends(server_context)]
Facade = Annotated[Conveyor, Depends(facade)]
