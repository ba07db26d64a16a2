"""What the runtime's services that span several stores need of the database.

A service that uses one store is typed by it (``Leadership`` and
``HeartbeatService``: ``WorkerStore``). One that spans several is typed by a
Protocol here naming the members it calls, each grouped under the store
(``backends.interfaces``) it comes from. The one ``Backend``
every process opens has them all; mypy checks that where it is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from ..backends.interfaces import Notifier
from ..records import (
    BatchRecord,
    ChainLink,
    Finalize,
    Heartbeat,
    Inserted,
    JobFilter,
    JobInsert,
    JobRecord,
    Lease,
    RescueResult,
    WorkerInfo,
)


class MaintenanceStore(Protocol):
    """The leader's maintenance (``Maintenance``)."""

    # LeaseStore
    def job_rescue(self, *, worker_ttl_s: float, now: datetime | None = None) -> RescueResult: ...

    def job_schedule_due(self, *, now: datetime | None = None) -> int: ...

    def job_age_priorities(
        self,
        *,
        aging_s: float,
        max_boost: int,
        window_s: float | None = None,
        now: datetime | None = None,
    ) -> int: ...

    def job_prune(
        self, *, state: str, older_than_s: float, limit: int = 1000, now: datetime | None = None
    ) -> int: ...

    def tidy(self, *, min_dead: int = 50_000) -> list[str]: ...

    # QueueStore
    def counts_fold(self) -> None: ...

    # WorkerStore
    def worker_prune_stale(self, *, older_than_s: float, now: datetime | None = None) -> int: ...

    # WorkflowStore
    def workflow_prune(
        self, *, state: str, older_than_s: float, limit: int = 500, now: datetime | None = None
    ) -> int: ...

    # DurableStore
    def event_wake_waiters(self, *, now: datetime | None = None) -> int: ...

    def event_prune(
        self, *, older_than_s: float, limit: int = 1000, now: datetime | None = None
    ) -> int: ...


class TickStore(Protocol):
    """The cron service (``CronService``)."""

    # CronStore
    def cron_first_seen(
        self, *, names: Sequence[str], now: datetime | None = None
    ) -> dict[str, datetime]: ...

    # JobStore
    def job_insert_many(self, *, jobs: Sequence[JobInsert]) -> list[Inserted]: ...


class WorkerBackend(Protocol):
    """The worker's own calls (``Worker``): its claim loop, its outcomes, its
    first and last word in the registry, and the burst worker's last look."""

    # SchemaStore
    name: str

    @property
    def latest_schema(self) -> int: ...

    def supports(self, capability: str) -> bool: ...

    def notifier(self) -> Notifier: ...

    # LeaseStore
    def job_claim(
        self,
        *,
        queues: Sequence[str],
        worker_id: str,
        limit: int,
        tasks: Sequence[str] | None = None,
        tags: Sequence[str] = (),
        schema_version: int | None = None,
    ) -> list[JobRecord]: ...

    def job_finalize_many(self, *, worker_id: str, outcomes: Sequence[Finalize]) -> list[int]: ...

    def job_outcome_written(self, *, outcome: Finalize, worker_id: str) -> bool: ...

    def job_release_many(self, *, worker_id: str, leases: Sequence[Lease]) -> list[int]: ...

    # WorkerStore
    def worker_heartbeat(self, *, worker: WorkerInfo) -> Heartbeat: ...

    def worker_deregister(self, *, worker_id: str) -> None: ...

    # JobStore
    def job_count(self, *, filter: JobFilter) -> dict[str, int]: ...


class FlowStores(Protocol):
    """The aggregator (``FlowService``): batches, chains, workflows."""

    # FlowStore
    def batch_ready(self, *, limit: int = 100) -> list[int]: ...

    def batch_close(self, *, batch_id: int, now: datetime | None = None) -> BatchRecord | None: ...

    def job_chain_due(self, *, limit: int = 100) -> list[ChainLink]: ...

    def job_chain_advance(
        self,
        *,
        job_id: int,
        next_job: JobInsert | None,
        state: str,
        now: datetime | None = None,
    ) -> int | None: ...

    # WorkflowStore
    def workflow_settle(
        self, *, links: Sequence[ChainLink], now: datetime | None = None
    ) -> int: ...
