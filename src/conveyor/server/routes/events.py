"""Live events as Server-Sent Events: ``GET /v1/events`` (jobs and batches as they
change, filterable) and ``GET /v1/batches/{id}/events`` (one batch's jobs, its
progress and first results, until it closes).

Every event carries an id; a client that reconnects with ``Last-Event-ID`` (or
``?after=``) receives everything it missed that is still in the database, in
order, nothing twice (``Conveyor.stream_events``). A slow client slows only its
own stream: events are read from the database as the client takes them, so the
server holds at most one page per client.

A stream is authorised as it opens and again while it runs (``Credential``):
before each write of events and at least every second, so a token revoked
while its stream is open stops receiving events and the stream ends.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import StreamingResponse

from ...records import ChangeCursor
from ..auth import READ, RECHECK_S, requires, still_allowed
from ..context import ServerContext
from ..dependencies import Ctx, Facade
from ..models import JobId, Name

#: the longest an idle stream stays silent (a comment line keeps proxies from closing it)
KEEPALIVE_S = 15.0
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


def encode(event: dict[str, Any]) -> str:
    """One event in the text/event-stream format (its data is already plain JSON
    values, from ``serialize``; JSON text holds no newline)."""
    data = json.dumps(event["data"], separators=(",", ":"), ensure_ascii=False)
    return f"id: {event['id']}\nevent: {event['event']}\ndata: {data}\n\n"


STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A stream of events (`text/event-stream`): `id`, `event` and a JSON `data`",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


#: the last line of a stream whose token was revoked while it ran
REVOKED = ": the token this stream was opened with is no longer valid\n\n"


class Credential:
    """The token (header or dashboard cookie) a stream was opened with, checked
    again while it runs: before each write of events, and at least every
    ``RECHECK_S`` while it is quiet. A stream whose token was revoked (or, on a
    server open until then, once a first token exists) ends, after ``REVOKED``."""

    def __init__(self, ctx: ServerContext, request: Request) -> None:
        self.ctx, self.request = ctx, request
        self.checked = time.monotonic()  # ``requires`` checked it as the stream opened

    async def lapsed(self, sending: bool) -> bool:
        if not sending and time.monotonic() - self.checked < RECHECK_S:
            return False
        if not await still_allowed(self.ctx, self.request, READ):
            return True
        self.checked = time.monotonic()
        return False


router = APIRouter(tags=["events"])


def stream(
    ctx: ServerContext, request: Request, after: str | None, **options: Any
) -> StreamingResponse:
    """Each read of the database goes out as one write (a burst of 500 events is
    one chunk, not 500); the socket's flow control holds the next read until the
    client has taken this one. A comment every 15 s keeps idle proxies open. The
    stream ends when its token no longer allows it (``Credential``)."""

    app, credential = ctx.conveyor, Credential(ctx, request)

    async def body() -> AsyncIterator[str]:
        quiet_since = time.monotonic()
        # an empty page at least once a second: the cue for a check and a keep-alive
        async for page in app.plumbing.stream_event_pages(after, **options):
            if await credential.lapsed(sending=bool(page)):
                yield REVOKED
                return
            if page:
                yield "".join(encode(e) for e in page)
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= KEEPALIVE_S:
                yield ": keep-alive\n\n"
                quiet_since = time.monotonic()

    return StreamingResponse(body(), media_type="text/event-stream", headers=HEADERS)


@router.get(
    "/events",
    response_class=StreamingResponse,
    responses=STREAM_DOC,
    dependencies=[requires(READ)],
    summary="Job and batch changes as Server-Sent Events",
    description="Events: job.created, job.started, job.succeeded, job.failed, "
    "job.retried, job.cancelled, batch.opened, batch.progress, batch.closed. Each "
    "job and batch is sent as its latest change left it.",
)
def events(
    resume: Resume,
    request: Request,
    ctx: Ctx,
    queue: Annotated[list[Name] | None, Query(description="only these queues")] = None,
    task: Annotated[list[Name] | None, Query(description="only these tasks")] = None,
    batch: Annotated[JobId | None, Query(description="only this batch's jobs")] = None,
    job: Annotated[list[JobId] | None, Query(description="only these jobs")] = None,
) -> StreamingResponse:
    return stream(ctx, request, resume, queues=queue, tasks=task, batch_id=batch, ids=job)


async def existing_batch(
    batch_id: Annotated[JobId, Path(description="the batch's id")], app: Facade
) -> None:
    await asyncio.to_thread(app.get_batch, batch_id)  # 404 before the stream starts


@router.get(
    "/batches/{batch_id}/events",
    response_class=StreamingResponse,
    responses=STREAM_DOC,
    dependencies=[requires(READ), Depends(existing_batch)],
    summary="One batch's jobs, progress and first results, until it closes",
    description="Starts with the batch's progress so far (unless resumed), then its "
    "jobs' events (finished jobs carry their results) and a batch.progress after "
    "each group of them, and ends with batch.closed.",
)
def batch_events(
    batch_id: Annotated[JobId, Path(description="the batch's id")],
    resume: Resume,
    request: Request,
    ctx: Ctx,
) -> StreamingResponse:
    return stream(ctx, request, resume, batch_id=batch_id, until_batch_closed=batch_id)
