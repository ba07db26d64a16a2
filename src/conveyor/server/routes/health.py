"""``/healthz``: the process answers. ``/readyz``: the database answers and its
schema is the one this code knows. Neither needs a token (probes have none)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from ...errors import ConveyorError
from ..context import ServerContext


def router(ctx: ServerContext) -> APIRouter:
    r = APIRouter(tags=["health"])

    @r.get("/healthz", summary="The process is up")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @r.get("/readyz", summary="The database answers and its schema is current")
    def readyz() -> JSONResponse:
        try:
            version, latest = ctx.conveyor.schema_version()
        except ConveyorError as exc:
            return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
        body = {"status": "ready", "schema_version": version, "latest_schema": latest}
        if version != latest:
            body["status"] = "schema_outdated" if version < latest else "schema_newer"
            return JSONResponse(body, status_code=503)
        return JSONResponse(body)

    return r
