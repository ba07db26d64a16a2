"""The cron service every worker runs: enqueue the due ticks of every periodic task.

No leader: every worker computes the same ticks and inserts them under the same
idempotency keys (``cron.tick_key``), and the unique index keeps one job per
tick. A service remembers the ticks it has already seen in the database, so
after the first pass it writes only for new ticks. A schedule never runs a tick
from before it was first seen by any worker (``missed="skip"``): deploying a new
schedule does not run the ticks of the last minute at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from ..cron import Periodic, due_ticks, tick_key
from ..records import JobInsert
from .service import ThreadService
from .stores import TickStore

if TYPE_CHECKING:
    from ..task import Task

log = logging.getLogger("conveyor.cron")


class CronHost(Protocol):
    """What the cron service reads of the app (``Conveyor`` is one): its schedules,
    its tasks, its retention, and its database."""

    @property
    def periodics(self) -> Mapping[str, Periodic]: ...

    @property
    def tasks(self) -> Mapping[str, Task]: ...

    @property
    def retention(self) -> Mapping[str, float | None]: ...

    @property
    def backend(self) -> TickStore: ...


class CronService(ThreadService):
    name = "cron"

    def __init__(self, app: CronHost) -> None:
        super().__init__(1.0)
        self.app = app
        #: per periodic, ticks known to have a job (created here or elsewhere)
        self._seen: dict[str, set[datetime]] = {}
        self._first_seen: dict[str, datetime] = {}

    def next_wait(self) -> float:
        return 1.005 - time.time() % 1.0  # just after every second

    def horizon_s(self) -> float | None:
        """Ticks older than this are never enqueued: the job of such a tick may have
        been pruned by retention, and enqueuing it again would run it twice."""
        kept = [s for s in self.app.retention.values() if s is not None]
        return min(kept) if kept else None

    def step(self, now: datetime | None = None) -> int:
        """One pass over every periodic; returns the jobs this call created."""
        now = now or datetime.now(UTC)
        periodics = dict(self.app.periodics)
        if not periodics:
            return 0
        new = [n for n in periodics if n not in self._first_seen]
        if new:
            self._first_seen.update(self.app.backend.cron_first_seen(names=new, now=now))
        horizon = self.horizon_s()
        todo: list[tuple[str, datetime, JobInsert]] = []
        for name, periodic in periodics.items():
            try:
                todo.extend(self._due(name, periodic, now, horizon))
            except Exception as exc:  # one bad schedule does not stop the others
                log.error("periodic %r: could not compute its due ticks: %s", name, exc)
        if not todo:
            return 0
        # one order everywhere: racing inserts of the same keys wait for each other
        # instead of deadlocking
        todo.sort(key=lambda item: item[2].idempotency_key or "")
        results = self.app.backend.job_insert_many(jobs=[ins for _, _, ins in todo])
        created = 0
        for (name, tick, _), res in zip(todo, results, strict=True):
            self._seen.setdefault(name, set()).add(tick)
            if res.created:
                created += 1
                log.debug("periodic %r: tick %s enqueued as job %d", name, tick.isoformat(), res.id)
        return created

    def _due(
        self, name: str, periodic: Periodic, now: datetime, horizon: float | None
    ) -> list[tuple[str, datetime, JobInsert]]:
        ticks = due_ticks(periodic, now, max_age_s=horizon)
        first = self._first_seen.get(name)
        if periodic.missed == "skip" and first is not None:
            ticks = [t for t in ticks if t >= first]  # nothing from before it existed
        seen = self._seen.get(name)
        if seen:
            oldest = ticks[0] if ticks else now
            seen.difference_update([t for t in seen if t < oldest])  # forget what is gone
            ticks = [t for t in ticks if t not in seen]
        if not ticks:
            return []
        task = periodic.task
        if isinstance(task, str):
            found = self.app.tasks.get(task)
            if found is None:
                raise LookupError(f"no task named {task!r} is registered")
            task = found
        template = task.build(periodic.args, periodic.kwargs)
        return [(name, t, template._replace(idempotency_key=tick_key(periodic, t))) for t in ticks]
