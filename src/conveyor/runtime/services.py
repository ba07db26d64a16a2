"""Maintenance every worker runs: the rescuer and the scheduler.

Both are safe to run from many workers at once: on PostgreSQL each pass claims
its rows with SKIP LOCKED, on SQLite passes serialise under the write lock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from ..backends.base import Backend

log = logging.getLogger("conveyor.maintenance")


@dataclass
class Maintenance:
    backend: Backend
    #: a worker silent this long was killed without deregistering
    stale_worker_s: float = 300.0

    def step(self, now: datetime | None = None) -> tuple[int, int, int]:
        """One pass: (requeued, failed, promoted). Loops call this; tests step it."""
        rescued = self.backend.job_rescue_expired(now=now)
        if rescued.requeued:
            log.warning(
                "requeued %d job(s) whose worker stopped renewing its lease: %s",
                len(rescued.requeued),
                _ids(rescued.requeued),
            )
        if rescued.failed:
            log.error(
                "failed %d job(s) that lost their lease on their last attempt: %s",
                len(rescued.failed),
                _ids(rescued.failed),
            )
        promoted = self.backend.job_schedule_due(now=now)
        self.backend.worker_prune_stale(older_than_s=self.stale_worker_s, now=now)
        return len(rescued.requeued), len(rescued.failed), promoted


def _ids(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:10])
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
