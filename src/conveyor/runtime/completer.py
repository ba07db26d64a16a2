"""Writes attempt outcomes in batches.

Outcomes queue up while a write is in flight, so under load one statement
carries many of them (group commit) and at low load each goes out at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..backends.base import Finalize

log = logging.getLogger("conveyor.worker")

Flush = Callable[[list[Finalize]], Awaitable[list[int]]]


class Completer:
    def __init__(
        self, flush: Flush, on_written: Callable[[Finalize, bool], None], max_batch: int = 500
    ) -> None:
        self._flush = flush
        self._on_written = on_written
        self._max_batch = max_batch
        self._pending: list[Finalize] = []
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._writing = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="conveyor-completer")

    def add(self, outcome: Finalize) -> None:
        self._pending.append(outcome)
        self._idle.clear()
        self._ready.set()

    @property
    def backlog(self) -> int:
        """Outcomes not yet in the database: queued, or in the write under way."""
        return len(self._pending) + self._writing

    def _take(self) -> list[Finalize]:
        """Up to max_batch outcomes, at most one per job: a second outcome for the
        same job (a sync handler's late result after its timeout) waits for the next
        write, so the database sees them in order and refuses the late one."""
        batch: list[Finalize] = []
        seen: set[int] = set()
        rest: list[Finalize] = []
        for o in self._pending:
            if o.job_id in seen or len(batch) >= self._max_batch:
                rest.append(o)
            else:
                seen.add(o.job_id)
                batch.append(o)
        self._pending = rest
        return batch

    async def _run(self) -> None:
        delay = 0.5
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._pending:
                batch = self._take()
                self._writing = len(batch)
                try:
                    accepted = set(await self._flush(batch))
                except Exception as exc:  # database away: keep the outcomes, try again
                    log.error(
                        "could not record %d job outcome(s), retrying in %.1fs: %s",
                        len(batch),
                        delay,
                        exc,
                    )
                    self._pending[:0] = batch
                    self._writing = 0
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
                    continue
                delay = 0.5
                self._writing = 0
                for o in batch:
                    self._on_written(o, o.job_id in accepted)
            if not self._pending:
                self._idle.set()
                if self._closing:
                    return

    async def close(self) -> None:
        """Write everything still queued, then stop."""
        self._closing = True
        self._ready.set()
        if self._task is not None:
            await self._idle.wait()
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
