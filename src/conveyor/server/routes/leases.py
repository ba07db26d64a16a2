"""The remote-worker protocol: workers in any language, over HTTP.

``POST /v1/leases`` registers (or heartbeats) the worker and claims up to
``limit`` jobs of its queues and task types, long-polling up to ``wait_s`` when
nothing is ready; each job comes back with its lease ``token``. The worker then
reports each job's end with that token: ``complete``, ``fail`` (retried with the
job's backoff or ``retry_in_s``, unless ``permanent`` or out of attempts),
``next-stage``, ``snooze``, or ``release``; many at once with ``/v1/leases/outcomes``.

Jobs are held exactly as in-process workers hold them: for as long as the worker
heartbeats (``POST /v1/workers/{id}/heartbeat``, or a lease call, every couple of
seconds); a job whose task has a timeout (``max_processing_s``) must also end
within it. An outcome under a lost lease (the worker went silent and the job was
rescued), or for a job that already ended, changes nothing and gets 409, saying
why. A job whose cancel was requested while it ran takes its worker's outcome
(200) and ends cancelled, unless it failed for good (``outcomes.accepted``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from ... import serialize
from ...app import Conveyor
from ...outcomes import OutcomeKind, OutcomeResult, Refusal, RemoteOutcome
from ...records import Lease
from ..auth import WORKER, requires
from ..context import ServerContext
from ..dependencies import Ctx, Facade
from ..models import JobId, Key, Name, Priority, Seconds, Strict, Timeout
from .workers import WorkerRegistration, worker_info

JobPath = Annotated[JobId, Path(description="the job's id")]
ErrorText = Annotated[str, Field(max_length=16_000)]
TracebackText = Annotated[str, Field(max_length=64_000)]
#: how often a long-polling lease call heartbeats the worker it waits for
BEAT_S = 2.0
DEFAULT_BATCH = 10
DEFAULT_POLL_S = 1.0


class LeaseRequest(WorkerRegistration):
    worker: Name = Field(description="the worker's id, the same on every call")
    limit: Annotated[int, Field(ge=1, le=1000)] | None = Field(
        None, description="jobs to claim at most (default: the task type's batch_size, else 10)"
    )
    wait_s: Annotated[float, Field(ge=0, le=300, allow_inf_nan=False)] = Field(
        0, description="long-poll: wait up to this many seconds for work (server max applies)"
    )
    lease_s: Timeout | None = Field(
        None, description="a deadline for every job claimed (clients that never heartbeat)"
    )


class Held(Strict):
    worker: Name
    token: Key = Field(description="the lease token the job came with")


class Complete(Held):
    result: Any = None


class Fail(Held):
    error: ErrorText | None = None
    traceback: TracebackText | None = None
    permanent: bool = Field(False, description="fail now, without retrying")
    retry_in_s: Seconds | None = Field(None, description="default: the job's backoff")


class NextStage(Held):
    stage: Name
    context: Any = None
    delay_s: Seconds = 0.0
    priority: Priority | None = None


class Snooze(Held):
    delay_s: Seconds


class OutcomeItem(Strict):
    job_id: JobId
    token: Key
    kind: OutcomeKind
    result: Any = None
    error: ErrorText | None = None
    traceback: TracebackText | None = None
    permanent: bool = False
    retry_in_s: Seconds | None = None
    stage: Name | None = None
    context: Any = None
    delay_s: Seconds = 0.0
    priority: Priority | None = None

    def outcome(self) -> RemoteOutcome:
        return RemoteOutcome(
            job_id=self.job_id,
            token=self.token,
            kind=self.kind,
            result=self.result,
            error=self.error,
            traceback=self.traceback,
            permanent=self.permanent,
            retry_in_s=self.retry_in_s,
            stage=self.stage,
            context=self.context,
            delay_s=self.delay_s,
            priority=self.priority,
        )


class Outcomes(Strict):
    worker: Name
    outcomes: list[OutcomeItem] = Field(min_length=1, max_length=1000)


def answer(result: OutcomeResult) -> Any:
    """200 with the job's next state, or 409 saying why nothing changed."""
    if result.accepted:
        return serialize.outcome(result)
    status = 404 if result.reason == Refusal.NOT_FOUND else 409
    return JSONResponse(
        {
            "detail": result.message,
            "reason": None if result.reason is None else str(result.reason),
            "job_id": result.job_id,
            "state": result.state,
        },
        status_code=status,
    )


router = APIRouter(tags=["leases (remote workers)"], dependencies=[requires(WORKER)])


def advice(app: Conveyor, tasks: list[str] | None) -> tuple[int, float]:
    """The default batch size and poll interval: the task types' settings."""
    settings = app.serving.cached_task_settings()
    known = [settings[t] for t in tasks or () if t in settings]
    sizes = [s.batch_size for s in known if s.batch_size]
    polls = [s.poll_interval_s for s in known if s.poll_interval_s]
    return min(sizes, default=DEFAULT_BATCH), min(polls, default=DEFAULT_POLL_S)


@router.post("/leases", summary="Claim jobs (long-poll)")
async def lease(body: LeaseRequest, request: Request, ctx: Ctx) -> Any:
    app = ctx.conveyor
    batch, poll = await asyncio.to_thread(advice, app, body.tasks)
    jobs, stop = await _claim_waiting(ctx, body, request, body.limit or batch)
    return {
        "worker": body.worker,
        "jobs": [serialize.lease(j) for j in jobs],
        "stop": stop,
        "heartbeat_s": min(BEAT_S, ctx.worker_ttl_s / 3),
        "batch_size": batch,
        "poll_interval_s": poll,
    }


async def _claim_waiting(
    ctx: ServerContext, body: LeaseRequest, request: Request, limit: int
) -> tuple[list[Any], bool]:
    """(the jobs claimed, whether the worker is asked to stop): claims until some
    come, the wait is over or the client has gone, heartbeating the worker meanwhile."""
    app, info = ctx.conveyor, worker_info(body.worker, body, request)
    deadline = time.monotonic() + min(body.wait_s, ctx.max_wait_s)
    beat_at = -BEAT_S
    jobs: list[Any] = []
    while True:
        generation = app.serving.work_generation()
        if time.monotonic() - beat_at >= BEAT_S:
            beat = await asyncio.to_thread(app.serving.heartbeat_worker, info)
            beat_at = time.monotonic()
            if beat.stop:
                return jobs, True
        if await request.is_disconnected():
            return jobs, False  # nobody would receive what we claim
        jobs = await asyncio.to_thread(
            app.serving.claim,
            body.worker,
            body.queues,
            limit=limit,
            tasks=body.tasks,
            tags=body.tags,
            lease_s=body.lease_s,
        )
        remaining = deadline - time.monotonic()
        if jobs or remaining <= 0:
            return jobs, False
        await app.serving.await_work(generation, remaining)


def report_one(app: Conveyor, worker: str, outcome: RemoteOutcome) -> Any:
    [result] = app.serving.report(worker, [outcome])
    return answer(result)


@router.post("/leases/{job_id}/complete", summary="The job succeeded")
def complete(job_id: JobPath, body: Complete, app: Facade) -> Any:
    outcome = RemoteOutcome(job_id, body.token, OutcomeKind.COMPLETE, result=body.result)
    return report_one(app, body.worker, outcome)


@router.post("/leases/{job_id}/fail", summary="The attempt failed")
def fail(job_id: JobPath, body: Fail, app: Facade) -> Any:
    outcome = RemoteOutcome(
        job_id,
        body.token,
        OutcomeKind.FAIL,
        error=body.error,
        traceback=body.traceback,
        permanent=body.permanent,
        retry_in_s=body.retry_in_s,
    )
    return report_one(app, body.worker, outcome)


@router.post("/leases/{job_id}/next-stage", summary="Back to the queue at the next stage")
def next_stage(job_id: JobPath, body: NextStage, app: Facade) -> Any:
    outcome = RemoteOutcome(
        job_id,
        body.token,
        OutcomeKind.NEXT_STAGE,
        stage=body.stage,
        context=body.context,
        delay_s=body.delay_s,
        priority=body.priority,
    )
    return report_one(app, body.worker, outcome)


@router.post("/leases/{job_id}/snooze", summary="Run again later, without using the attempt")
def snooze(job_id: JobPath, body: Snooze, app: Facade) -> Any:
    outcome = RemoteOutcome(job_id, body.token, OutcomeKind.SNOOZE, delay_s=body.delay_s)
    return report_one(app, body.worker, outcome)


@router.post("/leases/{job_id}/heartbeat", summary="Still working on it")
def heartbeat(job_id: JobPath, body: Held, request: Request, app: Facade) -> Any:
    """Heartbeats the worker (which keeps every job it holds) and checks this
    lease: 409 if it was lost; ``cancel_requested`` if an operator cancelled it."""
    beat = app.serving.heartbeat_worker(worker_info(body.worker, WorkerRegistration(), request))
    if beat.held.get(job_id) != body.token:
        return _lost(job_id)
    return {"job_id": job_id, "cancel_requested": job_id in beat.cancel, "stop": beat.stop}


@router.post("/leases/{job_id}/release", summary="Give the job back, unstarted")
def release(job_id: JobPath, body: Held, app: Facade) -> Any:
    """For a worker shutting down: the job goes back to the queue and the
    attempt does not count."""
    if not app.serving.release(body.worker, [Lease(job_id, body.token)]):
        return _lost(job_id)
    return {"job_id": job_id, "released": True}


@router.post("/leases/outcomes", summary="Report many outcomes at once")
def outcomes(body: Outcomes, app: Facade) -> Any:
    """One write for all (as an in-process worker batches them). Each result says
    whether it was accepted; refused ones changed nothing, and say why."""
    results = app.serving.report(body.worker, [o.outcome() for o in body.outcomes])
    return {"results": [serialize.outcome(x) for x in results]}


def _lost(job_id: int) -> JSONResponse:
    return JSONResponse(
        {
            "detail": f"the lease on job {job_id} is not held (lost, finished or cancelled)",
            "reason": "lease_lost",
            "job_id": job_id,
        },
        status_code=409,
    )
