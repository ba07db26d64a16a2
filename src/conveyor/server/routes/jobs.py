"""``/v1/jobs``: create (one, with ``Idempotency-Key``; or many in one
transaction), read, list with filters and a keyset cursor, cancel, retry,
delete; and the same actions in bulk over a filter (with ``dry_run``)."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Response
from fastapi.responses import JSONResponse

from ... import serialize
from ...app import Conveyor
from ...encoding import with_headers
from ...errors import ConfigError, Conflict, KeyReused
from ...job import Job
from ...records import ApiToken, JobFilter, JobInsert, JobState
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
    task = app.plumbing.task_for(body.task)
    insert, fingerprint = fingerprinted(task.build(body.args, body.kwargs, **options), body)
    [job] = app.plumbing.insert_jobs([insert], payloads=[(body.args, body.kwargs)])
    if job.created:
        job = app.get_job(job.id)  # the stored times, not the ones this process guessed
    elif fingerprint is not None:
        check_same_request(job, body, fingerprint, "header" if key else "field")
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
    inserts, payloads, prints = [], [], []
    for spec in body.jobs:
        task = app.plumbing.task_for(spec.task)
        insert, fingerprint = fingerprinted(
            task.build(spec.args, spec.kwargs, **spec.send_options()), spec
        )
        inserts.append(insert)
        payloads.append((spec.args, spec.kwargs))
        prints.append(fingerprint)
    check_keys_unused(app, body.jobs, prints)
    jobs = app.plumbing.insert_jobs(inserts, payloads=payloads)
    for n, (job, spec, fingerprint) in enumerate(zip(jobs, body.jobs, prints, strict=True)):
        if fingerprint is not None and not job.created:
            # a request racing this one took the key since check_keys_unused read:
            # refused all the same (this call's other jobs are written by now)
            check_same_request(job, spec, fingerprint, f"jobs[{n}]")
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
    tenant: Key | None = None,
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


def request_fingerprint(body: JobCreate) -> str:
    """What a request asked for, as a hash: every field it set but the key itself."""
    fields = body.model_dump(mode="json", exclude_none=True, exclude={"idempotency_key"})
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def fingerprinted(insert: JobInsert, body: JobCreate) -> tuple[JobInsert, str | None]:
    """A job sent under an idempotency key carries its request's fingerprint in a
    header, for a repeat to be compared with (None: no key, nothing to keep)."""
    if insert.idempotency_key is None:
        return insert, None
    fingerprint = request_fingerprint(body)
    headers = {serialize.FINGERPRINT_HEADER: fingerprint}
    return insert._replace(args_json=with_headers(insert.args_json, headers)), fingerprint


def check_keys_unused(app: Conveyor, specs: list[JobCreate], prints: list[str | None]) -> None:
    """Before a bulk create writes anything: 422 when an idempotency key names a
    different request, an earlier one's or another item's of this call (the
    insert would return that job, and the call's other jobs be written)."""
    first: dict[str, tuple[int, str]] = {}
    for n, (spec, fingerprint) in enumerate(zip(specs, prints, strict=True)):
        if spec.idempotency_key is None or fingerprint is None:
            continue
        seen = first.setdefault(spec.idempotency_key, (n, fingerprint))
        if seen[1] != fingerprint:
            raise KeyReused(
                spec.idempotency_key,
                f"by jobs[{seen[0]}] of this call",
                name=f"jobs[{n}].idempotency_key",
            )
    if not first:
        return
    earlier = app.list_jobs(
        JobFilter(idempotency_keys=tuple(first)), limit=len(first), primary=True
    )
    for job in earlier:
        n, fingerprint = first[job.idempotency_key or ""]
        check_same_request(job, specs[n], fingerprint, f"jobs[{n}]")


def check_same_request(job: Job, body: JobCreate, fingerprint: str, source: str) -> None:
    """422 unless the job an idempotency key named was created by this same
    request (a retry): as payment APIs do, a key reused for a different request is
    an error, not the first request's answer. A job created without a fingerprint
    (by Python's ``send``, the bulk call, or an older version) is compared on its
    task and arguments, all it kept of the request."""
    stored = job.headers.get(serialize.FINGERPRINT_HEADER)
    if stored is not None:
        same = stored == fingerprint
    else:
        same = (job.task, job.args, job.kwargs) == (body.task, body.args, body.kwargs)
    if not same:
        name = {"header": "Idempotency-Key", "field": "idempotency_key"}.get(
            source, f"{source}.idempotency_key"
        )
        raise KeyReused(job.idempotency_key or "", f"job {job.id}, task {job.task!r}", name=name)


def page(key: str, items: list[Any], limit: int, last_id: int, *more: object) -> dict[str, Any]:
    """A page and the cursor of the next one (``None`` when this one was short)."""
    return {
        key: items,
        "next_cursor": encode_cursor(last_id, *more) if len(items) >= limit else None,
    }
