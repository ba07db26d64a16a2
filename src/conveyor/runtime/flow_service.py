"""The aggregator: closes batches and advances chains. Every worker runs it, but
only the leader acts; a closing is exactly-once anyway (the callback has an
idempotency key), so a leadership handover overlap is harmless."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from ..backends.interfaces import FlowStore
from ..flow import next_step_insert
from ..records import JobState
from .service import ThreadService

log = logging.getLogger("conveyor.flow")

#: the shortest time between two passes of the aggregator, however often woken
FLOW_MIN_GAP_S = 0.01


class FlowService(ThreadService):
    name = "flow"

    def __init__(
        self,
        backend: FlowStore,
        *,
        is_leader: Callable[[], bool] = lambda: True,
        interval: float = 1.0,
    ) -> None:
        # Woken by every finished batch or chain job (PostgreSQL) or every commit
        # (SQLite's polled hints), a pass at most every 10 ms: during a drain the
        # hints come faster than that, and each pass is two queries.
        super().__init__(interval, min_gap=FLOW_MIN_GAP_S)
        self.backend = backend
        self.is_leader = is_leader

    def step(self, now: datetime | None = None) -> tuple[int, int]:
        """(batches closed, chain links advanced). Loops call this; tests step it."""
        if not self.is_leader():
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
            if link.state == JobState.SUCCEEDED and link.chain:
                nxt = next_step_insert(link.id, link.chain_root, link.result_json, link.chain)
            self.backend.job_chain_advance(job_id=link.id, next_job=nxt, state=link.state, now=now)
            advanced += 1
        return closed, advanced
