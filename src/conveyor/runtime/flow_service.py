"""The aggregator: closes batches, advances chains and workflows. Every worker runs it, but
only the leader acts; a closing is exactly-once anyway (the callback has an
idempotency key), so a leadership handover overlap is harmless."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from ..flow import next_step_insert
from ..records import JobState
from .service import ThreadService
from .stores import FlowStores

log = logging.getLogger("conveyor.flow")

#: the shortest time between two passes of the aggregator, however often woken
FLOW_MIN_GAP_S = 0.01
#: batches closed, and chain or workflow links advanced, in one pass at most
PASS_LIMIT = 100


class FlowService(ThreadService):
    name = "flow"

    def __init__(
        self,
        backend: FlowStores,
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
        self._more = False

    def next_wait(self) -> float:
        return 0.0 if self._more else super().next_wait()

    def step(self, now: datetime | None = None) -> tuple[int, int]:
        """(batches closed, chain links advanced). Loops call this; tests step it."""
        self._more = False
        if not self.is_leader():
            return 0, 0
        closed = 0
        ready = self.backend.batch_ready(limit=PASS_LIMIT)
        for batch_id in ready:
            batch = self.backend.batch_close(batch_id=batch_id, now=now)
            if batch is not None:
                closed += 1
                log.info("batch %d %s closed: %s", batch.id, batch.name or "", batch.state)
        advanced = 0
        due = self.backend.job_chain_due(limit=PASS_LIMIT)
        # A full pass leaves more to do: the next one runs at once, not after the poll.
        self._more = len(ready) >= PASS_LIMIT or len(due) >= PASS_LIMIT
        # A workflow node's job carries the empty chain: its end is the graph's to
        # record (all of this pass's in one transaction).
        advanced += self.backend.workflow_settle(links=[k for k in due if k.chain == []], now=now)
        for link in due:
            if link.chain == []:
                continue
            nxt = None
            if link.state == JobState.SUCCEEDED and link.chain:
                nxt = next_step_insert(link.id, link.chain_root, link.result_json, link.chain)
            self.backend.job_chain_advance(job_id=link.id, next_job=nxt, state=link.state, now=now)
            advanced += 1
        return closed, advanced
