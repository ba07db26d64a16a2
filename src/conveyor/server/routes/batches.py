"""``/v1/batches``: create one (N items in one transaction, optional
``on_complete`` task), read it with its progress, its jobs and its results as
they finish (first results while it runs), cancel it, retry its failed jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from pydantic import Field

from ... import serialize
from ...batch import Batch
from ...errors import ConfigError, KeyReused
from ...records import BatchState, JobFilter
from ..auth import PRODUCER, READ, requires
from ..dependencies import Facade
from ..models import (
    MAX_ID,
    JobId,
    Key,
    Name,
    SendOptions,
    TaskName,
    cursor_id,
    decode_cursor,
    encode_cursor,
)
from .jobs import IdempotencyKey, page

BatchPath = Annotated[JobId, Path(description="the batch's id")]


class BatchCreate(SendOptions):
    task: TaskName
    items: list[list[Any] | dict[str, Any]] = Field(
        min_length=1,
        max_length=100_000,
        description="one job per item: a list of positional arguments or an object of "
        "keyword arguments",
    )
    name: Name | None = None
    idempotency_key: Key | None = Field(
        None,
        description="a retried create returns the first batch, a different one under "
        "the same key is refused (or the header)",
    )
    on_complete: TaskName | None = Field(
        None, description="a task called as on_complete(batch_id, counts) when it closes"
    )


def _with_progress(batch: Batch) -> dict[str, Any]:
    return serialize.batch(batch.record, batch.progress())


def _results_cursor(cursor: str) -> tuple[datetime, int]:
    last_id, at = decode_cursor(cursor, 2)
    try:
        moment = datetime.fromisoformat(at)
        if moment.tzinfo is None or not 1970 <= moment.year <= 9000 or not last_id.isdigit():
            raise ValueError(at)
        if not 0 < int(last_id) <= MAX_ID:
            raise ValueError(last_id)
        return moment, int(last_id)
    except (ValueError, OverflowError):
        raise ConfigError("cursor: not a cursor this API returned") from None


router = APIRouter(tags=["batches"])


@router.post(
    "/batches",
    status_code=201,
    summary="Create a batch",
    dependencies=[requires(PRODUCER)],
    responses={200: {"description": "the idempotency key named an existing batch"}},
)
def create_batch(
    body: BatchCreate, response: Response, app: Facade, key: IdempotencyKey = None
) -> Any:
    """The batch row and one job per item, in one transaction. ``Idempotency-Key``
    (or ``idempotency_key``) makes a retried request return the same batch with
    200, and a different request under a key already used a 422 (the key names
    one request: its fingerprint is kept with the batch)."""
    if key is not None and body.idempotency_key not in (None, key):
        raise ConfigError("idempotency_key: differs from the Idempotency-Key header; send one")
    task = app.plumbing.task_for(body.task)
    try:
        batch = task.batch(
            body.items,
            name=body.name,
            idempotency_key=key or body.idempotency_key,
            on_complete=None
            if body.on_complete is None
            else app.plumbing.task_for(body.on_complete),
            **body.options(),
        )
    except KeyReused as exc:
        raise (exc if key is None else exc.named("Idempotency-Key")) from None
    response.status_code = 201 if batch.created else 200
    return _with_progress(batch)


@router.get("/batches", summary="List batches, newest first", dependencies=[requires(READ)])
def list_batches(
    app: Facade,
    state: BatchState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Any:
    batches = app.list_batches(state=state, limit=limit, before_id=cursor_id(cursor))
    items = [serialize.batch(b.record) for b in batches]
    return page("batches", items, limit, batches[-1].id if batches else 0)


@router.get(
    "/batches/{batch_id}",
    summary="A batch with its progress",
    dependencies=[requires(READ)],
)
def get_batch(batch_id: BatchPath, app: Facade) -> Any:
    return _with_progress(app.get_batch(batch_id))


@router.get(
    "/batches/{batch_id}/jobs",
    summary="The batch's jobs, newest first",
    dependencies=[requires(READ)],
)
def batch_jobs(
    batch_id: BatchPath,
    app: Facade,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Any:
    app.get_batch(batch_id)  # 404 for an unknown batch, not an empty list
    jobs = app.list_jobs(JobFilter(batch_id=batch_id), limit=limit, before_id=cursor_id(cursor))
    return page("jobs", [serialize.job(j) for j in jobs], limit, jobs[-1].id if jobs else 0)


@router.get(
    "/batches/{batch_id}/results",
    summary="Finished jobs in the order they finished",
    dependencies=[requires(READ)],
)
def batch_results(
    batch_id: BatchPath,
    app: Facade,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Any:
    """First results while the batch still runs: poll with ``next_cursor`` to get
    each finished job once, in the order they finished."""
    app.get_batch(batch_id)
    after = None if cursor is None else _results_cursor(cursor)
    jobs = app.batch_finished_jobs(batch_id, after=after, limit=limit)
    if after is not None:
        # SQLite keeps times as REAL seconds, read back rounded to microseconds:
        # the row the cursor names can compare as later than itself. Drop it.
        jobs = [j for j in jobs if j.finished_at is None or (j.finished_at, j.id) > after]
    # The cursor moves on even after a short page: more results keep coming.
    last = jobs[-1] if jobs else None
    return {
        "jobs": [serialize.job(j) for j in jobs],
        "next_cursor": cursor
        if last is None or last.finished_at is None
        else encode_cursor(last.id, last.finished_at.isoformat()),
    }


@router.post(
    "/batches/{batch_id}/cancel",
    summary="Cancel the batch's jobs not started yet",
    dependencies=[requires(PRODUCER)],
)
def cancel_batch(batch_id: BatchPath, app: Facade) -> Any:
    app.get_batch(batch_id)
    cancelled = app.cancel_batch(batch_id)
    return {"cancelled": cancelled, "batch": _with_progress(app.get_batch(batch_id))}


@router.post(
    "/batches/{batch_id}/retry-failed",
    summary="Retry the batch's failed jobs",
    dependencies=[requires(PRODUCER)],
)
def retry_failed(batch_id: BatchPath, app: Facade) -> Any:
    app.get_batch(batch_id)
    retried = app.retry_batch_failed(batch_id)
    return {"retried": retried, "batch": _with_progress(app.get_batch(batch_id))}
