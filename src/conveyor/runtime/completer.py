"""Writes attempt outcomes in batches.

Outcomes queue up while a write is in flight, so under load one statement
carries many of them (group commit) and at low load each goes out at once
(``gather_s`` > 0 waits that long for more before each write: fewer, larger
writes for a little latency).

A batch that fails because the database is away is kept and sent again, with
backoff; outcomes then refused are checked against the attempt log, since the
first send may have committed before the connection broke. A batch that fails
for any other reason is split: each outcome is written alone, and one the
database still refuses is replaced by a plain failure saying why, so one bad
row never holds back the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..encoding import storable_text
from ..errors import DatabaseUnavailable
from ..records import Finalize, JobState, Outcome

log = logging.getLogger("conveyor.worker")

Flush = Callable[[list[Finalize]], Awaitable[list[int]]]
Written = Callable[[Finalize], Awaitable[bool]]


class Completer:
    def __init__(
        self,
        flush: Flush,
        on_written: Callable[[Finalize, bool], None],
        already_written: Written,
        max_batch: int = 500,
        gather_s: float = 0.0,
    ) -> None:
        self._flush = flush
        self._gather_s = gather_s
        self._on_written = on_written
        self._already_written = already_written
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

    def holds(self, job_id: int) -> bool:
        return any(o.job_id == job_id for o in self._pending)

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
        # counted as being written before they leave the queue: the backlog, which
        # the worker's fetch thread reads too, never looks smaller than it is
        self._writing = len(batch)
        self._pending = rest
        return batch

    async def _run(self) -> None:
        delay = 0.5
        resent: set[tuple[int, str]] = set()
        while True:
            await self._ready.wait()
            if self._gather_s and len(self._pending) < self._max_batch:
                await asyncio.sleep(self._gather_s)  # let more outcomes join this write
            self._ready.clear()
            while self._pending:
                batch = self._take()
                try:
                    accepted = set(await self._flush(batch))
                except DatabaseUnavailable as exc:  # away: keep the outcomes, try again
                    log.error(
                        "could not record %d job outcome(s), retrying in %.1fs: %s",
                        len(batch),
                        delay,
                        exc,
                    )
                    resent.update((o.job_id, o.token) for o in batch)
                    self._pending[:0] = batch
                    self._writing = 0
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
                    continue
                except Exception as exc:  # the data: find the row, write the rest
                    log.error(
                        "writing %d outcome(s) failed, writing them one by one: %s", len(batch), exc
                    )
                    try:
                        accepted = await self._one_by_one(batch)
                    except DatabaseUnavailable:
                        resent.update((o.job_id, o.token) for o in batch)
                        self._pending[:0] = batch
                        self._writing = 0
                        await asyncio.sleep(delay)
                        continue
                delay = 0.5
                self._writing = 0
                for o in batch:
                    ok = o.job_id in accepted
                    if not ok and (o.job_id, o.token) in resent:
                        ok = await self._check_written(o)
                    resent.discard((o.job_id, o.token))
                    self._on_written(o, ok)
            if not self._pending:
                self._idle.set()
                if self._closing:
                    return

    async def _check_written(self, o: Finalize) -> bool:
        try:
            return await self._already_written(o)
        except Exception:
            return False

    async def _one_by_one(self, batch: list[Finalize]) -> set[int]:
        accepted: set[int] = set()
        for o in batch:
            try:
                accepted.update(await self._flush([o]))
                continue
            except DatabaseUnavailable:
                raise
            except Exception as exc:
                reason = storable_text(f"{type(exc).__name__}: {exc}", 2000)
                log.error(
                    "job %d: its outcome %r could not be stored: %s", o.job_id, o.outcome, reason
                )
            plain = Finalize(
                job_id=o.job_id,
                token=o.token,
                state=JobState.FAILED,
                outcome=Outcome.FAILED,
                error=f"the attempt ended ({o.outcome}) but its outcome could not be stored: "
                f"{reason}",
                ran_attempt=o.ran_attempt,
                ran_stage=o.ran_stage,
            )
            try:
                accepted.update(await self._flush([plain]))
            except DatabaseUnavailable:
                raise
            except Exception as exc:
                log.error("job %d: not even a plain failure could be stored: %s", o.job_id, exc)
        return accepted

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
