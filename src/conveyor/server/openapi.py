"""The OpenAPI document lists every status a route answers with, and the shape of
its errors. FastAPI lists a route's success and its 422 (as pydantic's error
list); the statuses that come from elsewhere (the token check, the body
parser and limit, the database away, a missing record, a state conflict) are
added here, in one place, so that a client (or schemathesis) reading the
document meets no status it was not told about.

Errors are ``{"detail": ...}``: a sentence, or pydantic's list of field errors
(422 on a malformed request); a refused lease outcome adds ``reason``,
``job_id`` and ``state``. Under ``/api`` (asyncflow) errors are asyncflow's
envelope sent with 200, except the HTTP layer's own refusals (401, 403, 413).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

PROBLEM = "Problem"
_PROBLEM_SCHEMA: dict[str, Any] = {
    "title": PROBLEM,
    "type": "object",
    "properties": {
        "detail": {
            "title": "Detail",
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"$ref": "#/components/schemas/ValidationError"}},
            ],
        }
    },
    "required": ["detail"],
}

ENVELOPE = "AsyncflowError"
_ENVELOPE_SCHEMA: dict[str, Any] = {
    "title": ENVELOPE,
    "type": "object",
    "properties": {
        "code": {"type": "integer"},
        "msg": {"type": "string"},
        "result": {"type": "null"},
    },
    "required": ["code", "msg"],
}

AUTH = {
    "401": "no API token, or one that is not valid",
    "403": "the token's scope does not allow this",
}
BODY = {
    "400": "the body is not valid JSON",
    "413": "the body is larger than the server takes (--max-body-bytes)",
}
DOWN = {"503": "the database does not answer, or its schema is not this server's"}
INVALID = "a field is wrong: the detail names it (pydantic's list, or a sentence)"
MISSING = {"404": "no such record"}
CONFLICT = {"409": "the record's state does not allow it; the detail says why"}
LEASE = {
    "404": "no such job",
    "409": "the lease is not held by this worker with this token (lost, finished, "
    "cancelled, or another worker's); nothing was changed",
}

#: statuses of single routes, beyond those every route of its kind has
ROUTES: dict[tuple[str, str], dict[str, str]] = {
    ("GET", "/v1/jobs/{job_id}"): MISSING,
    ("DELETE", "/v1/jobs/{job_id}"): MISSING | CONFLICT,
    ("POST", "/v1/jobs/{job_id}/cancel"): MISSING | CONFLICT,
    ("POST", "/v1/jobs/{job_id}/retry"): MISSING | CONFLICT,
    ("GET", "/v1/actions/{action_id}"): MISSING,
    ("GET", "/v1/batches/{batch_id}"): MISSING,
    ("GET", "/v1/batches/{batch_id}/jobs"): MISSING,
    ("GET", "/v1/batches/{batch_id}/results"): MISSING,
    ("GET", "/v1/batches/{batch_id}/events"): MISSING,
    ("POST", "/v1/batches/{batch_id}/cancel"): MISSING,
    ("POST", "/v1/batches/{batch_id}/retry-failed"): MISSING,
    ("GET", "/v1/workflows/{workflow_id}"): MISSING,
    ("GET", "/v1/workflows/{workflow_id}/nodes/{node}/items"): MISSING,
    ("GET", "/v1/workflows/{workflow_id}/events"): MISSING,
    ("POST", "/v1/workflows/{workflow_id}/cancel"): MISSING,
    ("POST", "/v1/workflows/{workflow_id}/retry"): MISSING | CONFLICT,
    ("GET", "/v1/workers/{worker_id}"): MISSING,
    ("POST", "/v1/workers/{worker_id}/stop"): MISSING,
    ("DELETE", "/v1/tasks/{task}/settings"): MISSING,
    ("DELETE", "/v1/tokens/{token_id}"): MISSING,
    ("POST", "/v1/leases/{job_id}/complete"): LEASE,
    ("POST", "/v1/leases/{job_id}/fail"): LEASE,
    ("POST", "/v1/leases/{job_id}/next-stage"): LEASE,
    ("POST", "/v1/leases/{job_id}/snooze"): LEASE,
    ("POST", "/v1/leases/{job_id}/heartbeat"): {"409": LEASE["409"]},
    ("POST", "/v1/leases/{job_id}/release"): {"409": LEASE["409"]},
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _problem(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    content = {"application/json": {"schema": schema or _ref(PROBLEM)}}
    return {"description": description, "content": content}


def _add(
    responses: dict[str, Any], statuses: dict[str, str], schema: dict[str, Any] | None = None
) -> None:
    for status, description in statuses.items():
        responses.setdefault(status, _problem(description, schema))


def _describe_operation(path: str, method: str, op: dict[str, Any]) -> None:
    responses: dict[str, Any] = op.setdefault("responses", {})
    has_body = "requestBody" in op
    if path.startswith("/api/"):
        # asyncflow answers its errors with 200 and a code, as flowsvr does
        responses.pop("422", None)
        _add(responses, AUTH, _ref(ENVELOPE))
        if has_body:  # (refused before the route, or while it reads the body)
            _add(responses, {"413": BODY["413"]}, {"anyOf": [_ref(PROBLEM), _ref(ENVELOPE)]})
        return
    if path == "/readyz":
        _add(responses, {"503": "not ready: the database does not answer, or its schema differs"})
    if not path.startswith(("/v1/", "/metrics")):
        return
    _add(responses, AUTH | DOWN | (BODY if has_body else {}))
    if "422" in responses or op.get("parameters") or has_body:
        responses["422"] = _problem(INVALID)
    _add(responses, ROUTES.get((method.upper(), path), {}))


def describe(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (FastAPI's document) with every route's statuses described."""
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas[PROBLEM] = _PROBLEM_SCHEMA
    schemas[ENVELOPE] = _ENVELOPE_SCHEMA
    if "ValidationError" not in schemas:  # FastAPI adds it with the first parameter
        schemas["ValidationError"] = {"type": "object"}
    for path, operations in schema.get("paths", {}).items():
        for method, op in operations.items():
            _describe_operation(path, method, op)
    return schema


def install(app: FastAPI) -> None:
    """Serve the described document at ``/openapi.json`` (built once, on first use)."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = describe(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
