"""Cluster-wide maintenance, run by the leader only: rescue the jobs of dead
workers, make due scheduled jobs available, age priorities, prune finished jobs,
forget long-dead workers, and tidy tables whose dead rows pile up. Every
statement is indexed and bounded, but for the tidying (a VACUUM on PostgreSQL),
which runs on a thread of its own so that it never holds up a rescue."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime

from ..records import RescueResult
from .service import SLOW_CONTACT_S, ThreadService
from .stores import MaintenanceStore

log = logging.getLogger("conveyor.maintenance")

#: how long emitted events are kept (durable waits find events emitted before them)
EVENT_RETENTION_S = 30 * 86400.0


class Maintenance(ThreadService):
    name = "maintenance"

    def __init__(
        self,
        backend: MaintenanceStore,
        *,
        is_leader: Callable[[], bool] = lambda: True,
        lost_at: Callable[[], float | None] = lambda: None,
        interval: float = 1.0,
        worker_ttl_s: float = 7.0,
        stale_worker_s: float = 300.0,
        aging_s: float | None = None,
        max_boost: int = 10,
        retention: Mapping[str, float | None] | None = None,
        prune_every_s: float = 60.0,
        tidy_every_s: float = 10.0,
        tidy_min_dead: int | None = 50_000,
        event_retention_s: float = EVENT_RETENTION_S,
    ) -> None:
        super().__init__(interval)
        self.backend = backend
        self.is_leader = is_leader
        #: ``time.monotonic()`` when this process was last out of touch with the
        #: database as the leader election saw it (``Leadership.lost_at``); this
        #: service's own failed or slow passes count too
        self.lost_at = lost_at
        self._lost_at: float | None = None
        self._held_back = False
        #: a worker silent this long is dead: its jobs are rescued
        self.worker_ttl_s = worker_ttl_s
        #: a worker silent this long is forgotten (its registry row removed)
        self.stale_worker_s = stale_worker_s
        #: priority aging: +1 priority per aging_s waited, at most max_boost (None: off)
        self.aging_s = aging_s
        self.max_boost = max_boost
        #: seconds to keep finished jobs, per state (None: forever)
        self.retention = dict(retention or {})
        self.prune_every_s = prune_every_s
        #: seconds to keep emitted events (a waiter that comes later still finds one)
        self.event_retention_s = event_retention_s
        #: how often to look for tables to tidy, and the dead rows that call for it
        self.tidy_every_s = tidy_every_s
        self.tidy_min_dead = tidy_min_dead
        self._tidying: threading.Thread | None = None
        self._last_tidy = 0.0
        self._last_slow = 0.0
        self._last_aged = 0.0
        self._last_prune = 0.0

    def step(self, now: datetime | None = None) -> None:
        if not self.is_leader():
            return
        try:
            self._step(now)
        except Exception:
            self._lost_at = time.monotonic()
            raise

    def _rescue_waits(self) -> float:
        """Seconds the rescue still waits after this process lost the database
        (0: none). While the database was out of reach, no worker's heartbeat
        could reach it either: a worker is judged silent only after the leader
        has been back for ``worker_ttl_s``, or a blip of a few seconds (a restart,
        a failover, a pooler restarted) made every live worker look dead, and their
        jobs ran again, or failed on their last attempt."""
        lost = [t for t in (self._lost_at, self.lost_at()) if t is not None]
        return max(lost, default=-math.inf) + self.worker_ttl_s - time.monotonic()

    def _step(self, now: datetime | None) -> None:
        began = time.monotonic()
        # Durable waits: jobs whose event was emitted while they were still running
        # (their own emit found them not yet scheduled; see SqlBackend.event_emit).
        self.backend.event_wake_waiters(now=now)
        self.backend.job_schedule_due(now=now)
        self.backend.counts_fold()
        if time.monotonic() - began > SLOW_CONTACT_S:
            # They waited for the database (an outage ending): so did the workers'
            # heartbeats. Before the rescue, whose call would have waited as well
            # and then judged every worker at once.
            self._lost_at = time.monotonic()
        waits = 0.0 if now is not None else self._rescue_waits()
        if waits <= 0:
            if self._held_back:
                self._held_back = False
                log.info("the database is back: workers silent since are rescued again")
            self.rescue(now)
        elif not self._held_back:
            self._held_back = True
            log.info(
                "no rescue for %.0fs: the database was out of reach, and the workers'"
                " heartbeats with it",
                waits,
            )
        clock = time.monotonic()
        if self.tidy_min_dead is not None and clock - self._last_tidy >= self.tidy_every_s:
            self._last_tidy = clock
            self.tidy_soon()
        # Aging needs only a pass per aging period (at most every 5 s); the rest
        # can wait a few seconds too (every pass when a test passes time in).
        if self.aging_s and (now is not None or clock - self._last_aged >= min(5.0, self.aging_s)):
            self.age(now, clock)
        if now is None and clock - self._last_slow < 5.0:
            return
        self._last_slow = clock
        if waits <= 0:  # a worker forgotten has its jobs rescued: not before either
            self.backend.worker_prune_stale(older_than_s=self.stale_worker_s, now=now)
        self.prune_due(now)

    def tidy_soon(self) -> threading.Thread | None:
        """Start a tidying pass on its own thread, unless one is still running.
        ``stop()`` does not wait for it: the server finishes its VACUUM whether or
        not the client is still there, and a cancelled one would leave the dead
        rows for the next leader (waiting held a `conveyor worker --burst` at its
        exit as long as the VACUUM ran: 0.42 s of a 1.7 s drain of 20,000 jobs)."""
        if self._tidying is not None and self._tidying.is_alive():
            return None
        self._tidying = threading.Thread(target=self._tidy, name="conveyor-tidy", daemon=True)
        self._tidying.start()
        return self._tidying

    def _tidy(self) -> None:
        assert self.tidy_min_dead is not None
        try:
            self.backend.tidy(min_dead=self.tidy_min_dead)
        except Exception as exc:  # the next pass tries again; nothing depends on it
            if not self.stopping:
                log.warning("could not tidy the tables: %s", exc)

    def age(self, now: datetime | None, clock: float) -> None:
        """One aging pass: the jobs whose age crossed a boost since the last pass
        (a margin covers the statement's own time), or all of them on this
        leader's first pass; a bounded statement at a time."""
        assert self.aging_s is not None
        window = None if self._last_aged == 0.0 else clock - self._last_aged + 1.0
        self._last_aged = clock
        for _ in range(100):  # at most 100,000 changes a pass; the next pass goes on
            n = self.backend.job_age_priorities(
                aging_s=self.aging_s, max_boost=self.max_boost, window_s=window, now=now
            )
            if n < 1000 or self.stopping:
                break

    def rescue(self, now: datetime | None = None) -> RescueResult:
        rescued = self.backend.job_rescue(worker_ttl_s=self.worker_ttl_s, now=now)
        if rescued.requeued:
            log.warning(
                "requeued %d job(s) whose worker stopped heartbeating: %s",
                len(rescued.requeued),
                _ids(rescued.requeued),
            )
        if rescued.failed:
            log.error(
                "failed %d job(s) that lost their worker on their last attempt: %s",
                len(rescued.failed),
                _ids(rescued.failed),
            )
        return rescued

    def prune_due(self, now: datetime | None = None) -> None:
        if now is None and time.monotonic() - self._last_prune < self.prune_every_s:
            return
        self._last_prune = time.monotonic()
        self.prune_events(now)
        for state, keep_s in self.retention.items():
            if keep_s is None:
                continue
            total = 0
            while True:  # small batches, each its own short transaction
                n = self.backend.job_prune(state=state, older_than_s=keep_s, limit=500, now=now)
                total += n
                if n < 500 or self.stopping:
                    break
            if total:
                log.info("pruned %d %s job(s) older than %gs", total, state, keep_s)
        self.prune_workflows(now)

    def prune_workflows(self, now: datetime | None = None) -> int:
        """Workflows ended longer ago than their state's job retention go, with
        their nodes (succeeded: the succeeded jobs' retention, and so on)."""
        total = 0
        for state, keep_s in self.retention.items():
            if keep_s is None or state not in ("succeeded", "failed", "cancelled"):
                continue
            while True:
                prune = self.backend.workflow_prune
                n = prune(state=state, older_than_s=keep_s, limit=500, now=now)
                total += n
                if n < 500 or self.stopping:
                    break
        if total:
            log.info("pruned %d workflow(s)", total)
        return total

    def prune_events(self, now: datetime | None = None) -> int:
        """Events older than their retention go (with steps whose job is gone)."""
        total = 0
        while True:
            n = self.backend.event_prune(older_than_s=self.event_retention_s, limit=500, now=now)
            total += n
            if n < 500 or self.stopping:
                break
        if total:
            log.info("pruned %d event(s) older than %gs", total, self.event_retention_s)
        return total


def _ids(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:10])
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
