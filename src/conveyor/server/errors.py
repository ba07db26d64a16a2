"""Errors as HTTP answers. Conveyor's own errors map to statuses (a missing id is
404, a state conflict 409, bad input 422, the database away 503); validation
errors name the field; nothing a client sends should end in a 500.

Under ``/api`` (asyncflow compatibility) every error is asyncflow's envelope,
``{"code": <non-zero>, "msg": ..., "result": null}``, sent with HTTP 200 as
flowsvr does (clients read ``code``); refusals of the HTTP layer itself (401,
403, 413) keep their status.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..encoding import storable_text
from ..errors import (
    ConfigError,
    Conflict,
    ConveyorError,
    DatabaseUnavailable,
    JobNotFound,
    SchemaError,
    SerializationError,
    UnknownTask,
)
from . import outage

log = logging.getLogger("conveyor.server")

#: most specific first (BadArguments is a ConfigError)
STATUS: Sequence[tuple[type[ConveyorError], int]] = (
    (JobNotFound, 404),
    (UnknownTask, 404),
    (Conflict, 409),
    (DatabaseUnavailable, 503),
    (SchemaError, 503),
    (ConfigError, 422),
    (SerializationError, 422),
)
#: statuses the asyncflow routes keep (the HTTP layer's own refusals)
HTTP_LEVEL = frozenset({401, 403, 413})
ASYNCFLOW_PREFIX = "/api/"
#: the paths of the APIs: their errors, an unknown path's 404 too, are JSON (any
#: other unknown path is a page someone asked for: the dashboard's 404 page)
API_PREFIXES = ("/v1", "/api")


def status_of(exc: ConveyorError) -> int:
    return next((status for kind, status in STATUS if isinstance(exc, kind)), 400)


def _route_path(request: Request) -> str:
    path: str = request.scope.get("path", "")
    root: str = request.scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _is_asyncflow(request: Request) -> bool:
    return _route_path(request).startswith(ASYNCFLOW_PREFIX)


def is_api(request: Request) -> bool:
    path = _route_path(request)
    return any(path == p or path.startswith(p + "/") for p in API_PREFIXES)


def envelope(code: int, msg: str, result: Any = None) -> dict[str, Any]:
    """asyncflow's answer: code 0 and "ok" on success."""
    return {"code": code, "msg": msg, "result": result}


def _answer(
    request: Request, status: int, detail: Any, headers: dict[str, str] | None = None
) -> JSONResponse:
    if _is_asyncflow(request):
        text = detail if isinstance(detail, str) else _sentence(detail)
        http = status if status in HTTP_LEVEL else 200
        return JSONResponse(envelope(status, text), status_code=http, headers=headers)
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _clean(value: Any) -> Any:
    return storable_text(value, 500) if isinstance(value, str) else value


def field_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors without the input echoed back (it may hold what cannot be
    encoded: a lone surrogate), every text made safe to send."""
    return [
        {
            "loc": [_clean(part) for part in e.get("loc", ())],
            "msg": _clean(str(e.get("msg", ""))),
            "type": _clean(str(e.get("type", ""))),
        }
        for e in exc.errors()
    ]


def _sentence(errors: Any) -> str:
    if not isinstance(errors, list):
        return str(errors)
    parts = []
    for e in errors:
        where = ".".join(str(p) for p in e.get("loc", ()) if p not in ("body", "query"))
        parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
    return "; ".join(parts)


async def conveyor_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ConveyorError)
    status = status_of(exc)
    if status == 503:
        # The message names the database's host, port, user (and a SchemaError's
        # its URL): for the operator's log, not for whoever sent the request.
        log.warning("%s %s: %s", request.method, _route_path(request), exc)
        public = outage.SCHEMA_MISMATCH if isinstance(exc, SchemaError) else outage.UNAVAILABLE
        return _answer(request, 503, public, {"Retry-After": str(outage.RETRY_AFTER_S)})
    return _answer(request, status, storable_text(str(exc) or type(exc).__name__, 2000))


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return _answer(request, 422, field_errors(exc))


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return _answer(request, exc.status_code, exc.detail, getattr(exc, "headers", None))


async def unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, _route_path(request))
    return _answer(request, 500, f"internal error ({type(exc).__name__}); see the server log")


def install(app: FastAPI) -> None:
    app.add_exception_handler(ConveyorError, conveyor_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
