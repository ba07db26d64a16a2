"""``/v1/jobs``: create (one, with ``Idempotency-Key``; or many in one
transaction), read, list with filters and a keyset cursor, cancel, retry,
delete; and the same actions in bulk over a filter (with ``dry_run``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Response
from fastapi.responses import JSONResponse

from ... import serialize
from ...app import Conveyor
from ...errors import ConfigError, Conflict, KeyReused
from ...records import ApiToken, JobState
from ..auth import ADMIN, PRODUCER, READ, requires
from ..dependencies import Facade
from ..models import (
    BulkAction,
    FilterFields,
    JobCreate,
    JobId,
    JobsCreate,
    Key,
    Moment,
    Name,
    Search,
    Tenant,
    cursor_id,
    encode_cursor,
)

IdempotencyKey = Annotated[
    Key | None,
    Header(
        alias="Idempotency-Key",
        description="a retried create with the same key returns the first job (200, not 201); "
        "a different request under a key already used is refused (422)",
    ),
]
JobPath = Annotated[JobId, Path(description="the job's id")]


router = APIRouter(tags=["jobs"])


@router.post(
    "/jobs",
    status_code=201,
    summary="Create a job",
    dependencies=[requires(PRODUCER)],
    responses={200: {"description": "the Idempotency-Key named an existing job"}},
)
def create_job(body: JobCreate, response: Response, app: Facade, key: IdempotencyKey = None) -> Any:
    """A job of any task, registered in this process or not (remote workers run
    those). Send options as fields; ``Idempotency-Key`` (or ``idempotency_key``)
    makes a retried request return the same job with 200, and a different
    request under a key already used a 422 (the key names one request: its
    fingerprint is kept with the job). The answer is the job as
    ``GET /v1/jobs/{id}`` shows it (without its attempt log)."""
    options = body.send_options()
    if key is not None:
        if options.get("idempotency_key") not in (None, key):
            raise ConfigError("idempotency_key: differs from the Idempotency-Key header; send one")
        options["idempotency_key"] = key
    insert = app.plumbing.task_for(body.task).build(body.args, body.kwargs, **options)
    try:
        [job] = app.plumbing.insert_jobs([insert], payloads=[(body.args, body.kwargs)])
    except KeyReused as exc:
        raise exc.named("Idempotency-Key" if key else "idempotency_key") from None
    if job.created:
        job = app.get_job(job.id)  # the stored times, not the ones this process guessed
    response.status_code = 201 if job.created else 200
    return serialize.job(job)


@router.post(
    "/jobs/bulk",
    status_code=201,
    summary="Create many jobs in one transaction",
    dependencies=[requires(PRODUCER)],
)
def create_jobs(body: JobsCreate, response: Response, app: Facade) -> Any:
    """All or none: one transaction. Jobs whose key named an existing job come
    back as that job with ``created: false``; an ``idempotency_key`` that named
    a different request (here or earlier) refuses the call with 422, as
    ``POST /v1/jobs`` does, and writes nothing."""
    inserts, payloads = [], []
    for spec in body.jobs:
        task = app.plumbing.task_for(spec.task)
        inserts.append(task.build(spec.args, spec.kwargs, **spec.send_options()))
        payloads.append((spec.args, spec.kwargs))
    try:
        jobs = app.plumbing.insert_jobs(inserts, payloads=payloads)
    except KeyReused as exc:
        raise exc.named(f"jobs[{exc.index or 0}].idempotency_key") from None
    created = sum(j.created for j in jobs)
    response.status_code = 201 if created else 200
    return {
        "created": created,
        "jobs": [{**serialize.job(j), "created": j.created} for j in jobs],
    }


@router.get("/jobs", summary="List jobs", dependencies=[requires(READ)])
def list_jobs(
    app: Facade,
    task: Annotated[list[Name] | None, Query(max_length=100)] = None,
    queue: Annotated[list[Name] | None, Query(max_length=100)] = None,
    state: Annotated[list[JobState] | None, Query()] = None,
    stage: Name | None = None,
    tenant: Tenant | None = None,
    batch_id: JobId | None = None,
    created_after: Moment | None = None,
    created_before: Moment | None = None,
    finished_after: Moment | None = None,
    finished_before: Moment | None = None,
    search: Search | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Any:
    """Newest first. ``next_cursor`` (when there may be more) gives the next page:
    keyset pagination on the id, as fast deep in a big table as on page one.
    ``search`` finds a substring of the arguments (as JSON text)."""
    f = FilterFields(
        task=task,
        queue=queue,
        state=state,
        stage=stage,
        tenant=tenant,
        batch_id=batch_id,
        created_after=created_after,
        created_before=created_before,
        finished_after=finished_after,
        finished_before=finished_before,
        search=search,
    ).to_filter()
    jobs = app.list_jobs(f, limit=limit, before_id=cursor_id(cursor))
    return page("jobs", [serialize.job(j) for j in jobs], limit, jobs[-1].id if jobs else 0)


@router.get("/jobs/{job_id}", summary="A job, with its attempts", dependencies=[requires(READ)])
def get_job(job_id: JobPath, app: Facade) -> Any:
    job = app.get_job(job_id)
    return {
        **serialize.job(job),
        "attempt_log": [serialize.attempt(a) for a in app.job_attempts(job_id)],
    }


@router.post(
    "/jobs/{job_id}/cancel",
    summary="Cancel a job",
    dependencies=[requires(PRODUCER)],
    responses={202: {"description": "running: its worker cancels it at its next heartbeat"}},
)
def cancel_job(job_id: JobPath, app: Facade) -> Any:
    outcome = app.cancel_job(job_id)
    if outcome is None:
        job = app.get_job(job_id)
        raise Conflict(f"job {job_id} has already finished ({job.state}): nothing to cancel")
    if outcome == JobState.CANCELLED:
        return {"result": str(JobState.CANCELLED), "job": serialize.job(app.get_job(job_id))}
    return JSONResponse({"result": "requested", "job_id": job_id}, status_code=202)


@router.post(
    "/jobs/{job_id}/retry",
    summary="Retry a failed or cancelled job",
    dependencies=[requires(PRODUCER)],
)
def retry_job(job_id: JobPath, app: Facade) -> Any:
    if not app.retry_job(job_id):
        job = app.get_job(job_id)
        raise Conflict(f"job {job_id} is {job.state}: only failed or cancelled jobs can be retried")
    return serialize.job(app.get_job(job_id))


@router.delete(
    "/jobs/{job_id}",
    status_code=204,
    summary="Delete a job that is not running",
    dependencies=[requires(ADMIN)],
)
def delete_job(job_id: JobPath, app: Facade) -> Response:
    if not app.delete_job(job_id):
        raise Conflict(f"job {job_id} is running: cancel it first, or wait for it to end")
    return Response(status_code=204)


def bulk(app: Conveyor, action: str, body: BulkAction, token: ApiToken | None) -> Any:
    f = body.checked_filter()
    if body.background and not body.dry_run:
        actor = "open server (loopback)" if token is None else (token.name or token.id)
        record = app.plumbing.start_bulk(action, f, actor=actor)
        return JSONResponse(serialize.action(record), status_code=202)
    return serialize.bulk(app.plumbing.bulk_method(action)(f, dry_run=body.dry_run))


#: the token names who ran an action: the scope check's answer, as a parameter
AsProducer = Annotated[ApiToken | None, requires(PRODUCER)]
AsAdmin = Annotated[ApiToken | None, requires(ADMIN)]
BACKGROUND: dict[int | str, dict[str, Any]] = {
    202: {"description": "background: the action's record; it runs on"}
}


@router.post(
    "/jobs/bulk-retry",
    summary="Retry every failed or cancelled job matching a filter",
    responses=BACKGROUND,
)
def bulk_retry(body: BulkAction, token: AsProducer, app: Facade) -> Any:
    return bulk(app, "retry", body, token)


@router.post(
    "/jobs/bulk-cancel",
    summary="Cancel every unfinished job matching a filter",
    responses=BACKGROUND,
)
def bulk_cancel(body: BulkAction, token: AsProducer, app: Facade) -> Any:
    return bulk(app, "cancel", body, token)


@router.post(
    "/jobs/bulk-delete",
    summary="Delete every job matching a filter that is not running",
    responses=BACKGROUND,
)
def bulk_delete(body: BulkAction, token: AsAdmin, app: Facade) -> Any:
    return bulk(app, "delete", body, token)


@router.get(
    "/actions",
    summary="Bulk actions run in the background, newest first (the audit log)",
    dependencies=[requires(READ)],
)
def list_actions(app: Facade, limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> Any:
    return {"actions": [serialize.action(a) for a in app.bulk_actions(limit=limit)]}


@router.get(
    "/actions/{action_id}",
    summary="One bulk action: who asked, what it matched, how far it got",
    dependencies=[requires(READ)],
)
def get_action(action_id: Annotated[Key, Path(max_length=64)], app: Facade) -> Any:
    return serialize.action(app.plumbing.bulk_action(action_id))


def page(key: str, items: list[Any], limit: int, last_id: object, *more: object) -> dict[str, Any]:
    """A page and the cursor of the next one (``None`` when this one was short)."""
    return {
        key: items,
        "next_cursor": encode_cursor(last_id, *more) if len(items) >= limit else None,
    }
