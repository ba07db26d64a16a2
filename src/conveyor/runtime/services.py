"""Maintenance every worker runs: the rescuer and the scheduler.

Both are safe to run from many workers at once: on PostgreSQL each pass claims
its rows with SKIP LOCKED, on SQLite passes serialise under the write lock.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime

from ..backends.base import Backend
from ..flow import next_step_insert

log = logging.getLogger("conveyor.maintenance")


@dataclass
class Maintenance:
    backend: Backend
    #: a worker silent this long was killed without deregistering
    stale_worker_s: float = 300.0
    #: priority aging: +1 priority per aging_s waited, at most max_boost (None: off)
    aging_s: float | None = None
    max_boost: int = 10
    #: retention: seconds to keep finished jobs, per state (None: forever)
    retention: dict[str, float | None] = field(default_factory=dict)
    prune_every_s: float = 60.0
    _last_prune: float = 0.0

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
        if self.aging_s:
            self.backend.job_age_priorities(aging_s=self.aging_s, max_boost=self.max_boost, now=now)
        if time.monotonic() - self._last_prune >= self.prune_every_s or now is not None:
            self._last_prune = time.monotonic()
            self.prune(now=now)
        return len(rescued.requeued), len(rescued.failed), promoted

    def prune(self, now: datetime | None = None, dry_run: bool = False) -> dict[str, int]:
        """Retention, in small batches (each its own short transaction) so the queue
        is never locked for long. Returns jobs pruned (or that would be) per state."""
        pruned: dict[str, int] = {}
        for state, keep_s in self.retention.items():
            if keep_s is None:
                continue
            total = 0
            while True:
                n = self.backend.job_prune(
                    state=state, older_than_s=keep_s, limit=500, dry_run=dry_run, now=now
                )
                total += n
                if dry_run or n < 500:
                    break
            pruned[state] = total
            if total and not dry_run:
                log.info("pruned %d %s job(s) older than %gs", total, state, keep_s)
        return pruned


def _ids(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:10])
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")


@dataclass
class FlowService:
    """The aggregator: closes batches and advances chains. Every worker runs it,
    but only the holder of the "flow" leader lease acts; when the holder dies its
    lease expires and another worker takes over. Closing is exactly-once anyway
    (the callback has an idempotency key), so a handover overlap is harmless."""

    backend: Backend
    holder: str
    ttl_s: float = 10.0
    is_leader: bool = False
    _renewed: float = 0.0

    def elect(self, now: datetime | None = None) -> bool:
        """Take or renew the lease; leader or not, ask at most every ttl/3 (a wake-up
        storm must not turn into a storm of election writes)."""
        clock = time.monotonic()
        if not self._renewed or clock - self._renewed > self.ttl_s / 3 or now is not None:
            was = self.is_leader
            self.is_leader = self.backend.leader_attempt_elect(
                name="flow", holder=self.holder, ttl_s=self.ttl_s, now=now
            )
            self._renewed = clock
            if self.is_leader and not was:
                log.info("%s is now the flow leader (closes batches, advances chains)", self.holder)
        return self.is_leader

    def step(self, now: datetime | None = None) -> tuple[int, int]:
        """One pass: (batches closed, chain links advanced). Loops call this; tests step it."""
        if not self.elect(now):
            return 0, 0
        closed = 0
        for batch_id in self.backend.batch_ready(limit=100):
            batch = self.backend.batch_close(batch_id=batch_id, now=now)
            if batch is not None:
                closed += 1
                log.info("batch %d %s closed: %s", batch.id, batch.name or "", batch.state)
        advanced = 0
        for link in self.backend.job_chain_due(limit=100):
            nxt = None
            if link.state == "succeeded" and link.chain:
                nxt = next_step_insert(link.id, link.chain_root, link.result_json, link.chain)
            self.backend.job_chain_advance(job_id=link.id, next_job=nxt, now=now)
            advanced += 1
        return closed, advanced

    def resign(self) -> None:
        if self.is_leader:
            self.backend.leader_resign(name="flow", holder=self.holder)
            self.is_leader = False
