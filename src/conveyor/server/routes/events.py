"""Live events as Server-Sent Events: ``GET /v1/events`` (jobs and batches as they
change, filterable) and ``GET /v1/batches/{id}/events`` (one batch's jobs, its
progress and first results, until it closes).

Every event carries an id; a client that reconnects with ``Last-Event-ID`` (or
``?after=``) receives everything it missed that is still in the database, in
order, nothing twice (``Conveyor.stream_events``). A slow client slows only its
own stream: events are read from the database as the client takes them, so the
server holds at most one page per client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent

from ...records import ChangeCursor
from ..auth import READ, requires
from ..context import ServerContext
from ..models import JobId, Name

AFTER = (
    "resume after this event id (what the last event's `id` was); without it, or a "
    "`Last-Event-ID` header, the stream starts now"
)


def resume_from(
    after: Annotated[str | None, Query(max_length=100, description=AFTER)] = None,
    last_event_id: Annotated[str | None, Header(max_length=100)] = None,
) -> str | None:
    """Where a stream resumes: ``Last-Event-ID`` (what browsers send on reconnect)
    or ``?after=``; checked before the stream starts, so a bad id is a 422."""
    resume = last_event_id or after
    if resume is not None:
        ChangeCursor.parse(resume)
    return resume


Resume = Annotated[str | None, Depends(resume_from)]


def router(ctx: ServerContext) -> APIRouter:
    app = ctx.conveyor
    r = APIRouter(tags=["events"])

    async def stream(
        request: Request, after: str | None, **options: Any
    ) -> AsyncIterator[ServerSentEvent]:
        async for event in app.stream_events(after, **options):
            if await request.is_disconnected():
                return
            yield ServerSentEvent(id=event["id"], event=event["event"], data=event["data"])

    @r.get(
        "/events",
        response_class=EventSourceResponse,
        dependencies=[requires(ctx, READ)],
        summary="Job and batch changes as Server-Sent Events",
        description="Events: job.created, job.started, job.succeeded, job.failed, "
        "job.retried, job.cancelled, batch.opened, batch.progress, batch.closed. Each "
        "job and batch is sent as its latest change left it.",
    )
    async def events(
        request: Request,
        resume: Resume,
        queue: Annotated[list[Name] | None, Query(description="only these queues")] = None,
        task: Annotated[list[Name] | None, Query(description="only these tasks")] = None,
        batch: Annotated[JobId | None, Query(description="only this batch's jobs")] = None,
        job: Annotated[list[JobId] | None, Query(description="only these jobs")] = None,
    ) -> AsyncIterator[ServerSentEvent]:
        async for e in stream(request, resume, queues=queue, tasks=task, batch_id=batch, ids=job):
            yield e

    async def existing_batch(
        batch_id: Annotated[JobId, Path(description="the batch's id")],
    ) -> None:
        await asyncio.to_thread(app.get_batch, batch_id)  # 404 before the stream starts

    @r.get(
        "/batches/{batch_id}/events",
        response_class=EventSourceResponse,
        dependencies=[requires(ctx, READ), Depends(existing_batch)],
        summary="One batch's jobs, progress and first results, until it closes",
        description="Starts with the batch's progress so far (unless resumed), then its "
        "jobs' events (finished jobs carry their results) and a batch.progress after "
        "each group of them, and ends with batch.closed.",
    )
    async def batch_events(
        request: Request,
        batch_id: Annotated[JobId, Path(description="the batch's id")],
        resume: Resume,
    ) -> AsyncIterator[ServerSentEvent]:
        async for e in stream(request, resume, batch_id=batch_id, until_batch_closed=batch_id):
            yield e

    return r
