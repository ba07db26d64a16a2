"""The façade's change events and waits: what ``Conveyor.changes``,
``stream_events``, ``wait_job`` and the handles' ``wait`` go through. One
``ChangeWaiter`` per app turns the database's hints into wake-ups for them all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from . import serialize
from .backends.interfaces import Backend
from .batch import Batch
from .checks import make_filter
from .job import Job
from .records import BatchState, Change, ChangeCursor, JobFilter
from .waiter import ChangeWaiter


class EventsHost(Protocol):
    """What the events side calls on the app (``Conveyor`` is one)."""

    @property
    def backend(self) -> Backend: ...

    @property
    def reads(self) -> Backend: ...

    def get_job(self, job_id: int) -> Job: ...

    async def aget_job(self, job_id: int) -> Job: ...

    def get_batch(self, batch_id: int) -> Batch: ...

    def why_waiting(self, job_id: int) -> list[str]: ...


class Events:
    """The change stream and waits of one app."""

    def __init__(self, host: EventsHost) -> None:
        self._host = host
        self.waiter = ChangeWaiter(lambda: host.backend)

    def change_generation(self) -> int:
        return self.waiter.generation

    def wait_for_change(self, generation: int, timeout: float) -> None:
        self.waiter.wait(generation, timeout)

    def reset(self) -> None:
        """The app closed its database: a new waiter, opened again on first use."""
        self.waiter.close()
        self.waiter = ChangeWaiter(lambda: self._host.backend)

    def wait_job(self, job_id: int, timeout: float | None = None) -> Job:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            generation = self.waiter.generation
            job = self._host.get_job(job_id)
            if job.state.finished:
                return job
            remaining = 3600.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(self._still(job, timeout))
            self.waiter.wait(generation, remaining)

    def _still(self, job: Job, timeout: float | None) -> str:
        """A wait's timeout, with what holds the job back if it waits (no worker
        serves it, its queue is paused, ...: ``why_waiting``)."""
        said = f"job {job.id} still {job.state} after {timeout}s"
        try:
            reasons = self._host.why_waiting(job.id) if not job.state.finished else []
        except Exception:  # (a hint only: the timeout is the answer)
            reasons = []
        return f"{said}: {'; '.join(reasons)}" if reasons else said

    async def await_job(self, job_id: int, timeout: float | None = None) -> Job:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            generation = self.waiter.generation
            job = await self._host.aget_job(job_id)
            if job.state.finished:
                return job
            remaining = 3600.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(await asyncio.to_thread(self._still, job, timeout))
            await self.waiter.await_change(generation, remaining)

    def changes(
        self,
        after: str | ChangeCursor | None = None,
        filter: JobFilter | None = None,
        *,
        batches: bool = True,
        limit: int = 500,
        **fields: Any,
    ) -> tuple[list[Change], ChangeCursor]:
        cursor = self.cursor(after)
        found = self._host.reads.changes_since(
            after=cursor, filter=make_filter(filter, **fields), batches=batches, limit=limit
        )
        return found, (found[-1].cursor if found else cursor)

    def cursor(self, after: str | ChangeCursor | None) -> ChangeCursor:
        if after is None:
            return self._host.reads.changes_head()
        return after if isinstance(after, ChangeCursor) else ChangeCursor.parse(after)

    async def stream_events(
        self,
        after: str | None = None,
        filter: JobFilter | None = None,
        batches: bool = True,
        progress: bool = True,
        until_batch_closed: int | None = None,
        limit: int = 500,
        debounce_s: float = 0.025,
        **fields: Any,
    ) -> AsyncIterator[dict[str, Any]]:
        async for page in self.stream_event_pages(
            after,
            filter,
            batches=batches,
            progress=progress,
            until_batch_closed=until_batch_closed,
            limit=limit,
            debounce_s=debounce_s,
            **fields,
        ):
            for event in page:
                yield event

    async def stream_event_pages(
        self,
        after: str | None = None,
        filter: JobFilter | None = None,
        batches: bool = True,
        progress: bool = True,
        until_batch_closed: int | None = None,
        limit: int = 500,
        debounce_s: float = 0.025,
        **fields: Any,
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """``stream_events`` a page at a time (what one read of the database found:
        a server sends it as one write), and an empty page at least once a second
        while nothing happens (a server's cue for a keep-alive)."""
        f = make_filter(filter, **fields)
        cursor = await asyncio.to_thread(self.cursor, after)
        if until_batch_closed is not None and after is None:
            # a new follower of one batch starts from where it stands (read after the
            # head: the events that follow are never older than this snapshot)
            batch = await asyncio.to_thread(self._host.get_batch, until_batch_closed)
            first = [serialize.progress_event(str(cursor), batch.id, batch.progress())]
            if batch.finished:
                data = serialize.batch(batch.record)
                first.append({"id": str(cursor), "event": "batch.closed", "data": data})
            yield first if progress else first[1:]
            if batch.finished:
                return
        while True:
            generation = self.waiter.generation
            last_read = time.monotonic()
            found, cursor = await asyncio.to_thread(
                self.changes, cursor, f, batches=batches, limit=limit
            )
            page, closed = await self._event_page(found, progress, until_batch_closed)
            yield page
            if closed:
                return
            if len(found) < limit:
                await self.waiter.await_change(generation, 1.0)
                # at most one read per debounce_s: a burst gathers, a lone change is
                # read at once
                await asyncio.sleep(max(0.0, last_read + debounce_s - time.monotonic()))

    async def _event_page(
        self, found: list[Change], progress: bool, until_batch_closed: int | None
    ) -> tuple[list[dict[str, Any]], bool]:
        """The events of one read, with the progress of each batch whose jobs changed
        in it. A progress event carries the id of the event just before it: a client
        resuming from it misses nothing and receives nothing twice."""
        page: list[dict[str, Any]] = []
        touched: set[int] = set()
        closed = False
        at = ""
        for c in found:
            if c.batch is not None and c.batch.id in touched and progress:
                touched.discard(c.batch.id)  # its progress before its closing
                page.append(await self._progress_event(c.batch.id, at))
            page.append(serialize.change(c))
            at = str(c.cursor)
            if c.job is not None and c.job.batch_id is not None:
                touched.add(c.job.batch_id)
            if c.batch is not None and c.batch.id == until_batch_closed:
                closed = c.batch.state != BatchState.RUNNING
        if progress:
            for batch_id in sorted(touched):
                page.append(await self._progress_event(batch_id, at))
        return page, closed

    async def _progress_event(self, batch_id: int, at: str) -> dict[str, Any]:
        counts = await asyncio.to_thread(lambda: self._host.get_batch(batch_id).progress())
        return serialize.progress_event(at, batch_id, counts)
