"""The one seam between Conveyor and a database.

Everything above this module speaks in domain verbs (``job_insert_many``,
``job_fetch_available``, ...); everything below it is SQL, one package per
dialect. The seam is synchronous: the worker calls it from its own database
threads, producers call it directly. Every method takes keyword arguments, and
those that depend on time take ``now`` (``None`` means the database's clock),
so tests can step time without sleeping.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from ..job import Attempt, Job


class JobInsert(NamedTuple):
    """One job to create. ``args_json`` is already-encoded ``{"args":..,"kwargs":..}``.
    A NamedTuple rather than a dataclass: bulk enqueue builds thousands per call."""

    queue: str
    task: str
    args_json: str
    priority: int = 0
    max_attempts: int = 3
    delay_s: float = 0.0
    timeout_s: float | None = None
    backoff_json: str | None = None
    unique_key: str | None = None
    idempotency_key: str | None = None
    batch_id: int | None = None
    stage: str | None = None
    context_json: str | None = None
    #: steps still to run after this job: a JSON list of step templates
    chain_json: str | None = None
    chain_root: int | None = None
    #: at most concurrency_limit jobs with this key run at once, cluster-wide
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    #: a token bucket shared by all workers: rate_per_s tokens a second, up to burst
    rate_key: str | None = None
    rate_per_s: float | None = None
    rate_burst: float | None = None
    #: JSON list of worker ids/tags; one must be the claiming worker's
    pinned_to: str | None = None
    #: jobs of one spread group each run on a different worker
    spread_group: str | None = None


@dataclass(frozen=True)
class Inserted:
    """Outcome of one ``JobInsert``: the job id, and whether this call created it
    (``False`` when a unique or idempotency key already named an existing job)."""

    id: int
    created: bool


@dataclass(frozen=True)
class Lease:
    """Proof that a worker holds a running job: only the holder knows the token."""

    job_id: int
    token: str


class Finalize(NamedTuple):
    """End of one attempt, written only if the lease is still held.

    ``state`` is the job's next state: ``succeeded``, ``failed``, ``cancelled``, or
    ``scheduled`` (a retry, due ``retry_in_s`` seconds after ``now``). A NamedTuple:
    a busy worker makes one per job.
    """

    job_id: int
    token: str
    state: str
    outcome: str
    result_json: str | None = None
    error: str | None = None
    traceback: str | None = None
    retry_in_s: float | None = None
    #: the attempt number and stage this outcome ends (recorded with the attempt)
    ran_attempt: int | None = None
    ran_stage: str | None = None
    #: outcome "stage": the job moves on to this stage, attempts start again
    next_stage: str | None = None
    context_json: str | None = None
    priority: int | None = None


@dataclass(frozen=True)
class BatchRecord:
    id: int
    name: str | None
    task: str
    total: int
    state: str
    idempotency_key: str | None
    on_complete: dict[str, Any] | None
    closings: int
    counts: dict[str, int] | None
    created_at: datetime
    finished_at: datetime | None
    cancelled_at: datetime | None


@dataclass(frozen=True)
class ChainLink:
    """A finished job whose chain has not been advanced yet."""

    id: int
    state: str
    result_json: str | None
    error: str | None
    chain: list[dict[str, Any]]
    chain_root: int | None


@dataclass(frozen=True)
class Heartbeat:
    """What a heartbeat learns: the leases still held, the held jobs whose
    cancellation was requested, and whether an operator asked the worker to stop."""

    held: list[int] = field(default_factory=list)
    cancel: list[int] = field(default_factory=list)
    stop: bool = False


@dataclass(frozen=True)
class QueueInfo:
    name: str
    paused: bool
    counts: dict[str, int]
    max_running: int | None = None


@dataclass(frozen=True)
class RescueResult:
    requeued: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    hostname: str
    pid: int
    queues: list[str]
    concurrency: int
    tags: list[str] = field(default_factory=list)
    started_at: datetime | None = None
    last_seen_at: datetime | None = None


@dataclass(frozen=True)
class QueueCount:
    queue: str
    state: str
    count: int


class Notifier(abc.ABC):
    """A source of hints that a queue may have work. Hints may be lost or spurious:
    the worker always polls as well."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> set[str]:
        """Block up to ``timeout`` seconds; return the queues hinted at (may be empty)."""

    @abc.abstractmethod
    def close(self) -> None: ...


class Backend(abc.ABC):
    """Domain-level operations every dialect implements and the conformance suite checks."""

    name: str
    #: whether ``notifier()`` delivers cross-process hints promptly (LISTEN/NOTIFY)
    pushes_notifications: bool = False

    # -- lifecycle ---------------------------------------------------------------
    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def migrate(self) -> list[int]:
        """Apply pending migrations; return the versions applied. Refuses a newer schema."""

    @property
    @abc.abstractmethod
    def latest_schema(self) -> int:
        """The newest schema version this code knows."""

    @abc.abstractmethod
    def schema_version(self) -> int:
        """Version of the schema in the database (0 if none)."""

    @abc.abstractmethod
    def notifier(self) -> Notifier: ...

    # -- jobs: producers ----------------------------------------------------------
    @abc.abstractmethod
    def job_insert_many(
        self, *, jobs: Sequence[JobInsert], conn: Any = None, now: datetime | None = None
    ) -> list[Inserted]:
        """Create jobs in one transaction (the caller's, if ``conn`` is given).
        Keys already in use return the existing job with ``created=False``."""

    # -- jobs: workers ------------------------------------------------------------
    @abc.abstractmethod
    def job_fetch_available(
        self,
        *,
        queues: Sequence[str],
        worker_id: str,
        limit: int,
        lease_s: float,
        tags: Sequence[str] = (),
        now: datetime | None = None,
    ) -> list[Job]:
        """Claim up to ``limit`` due jobs, highest priority first, leasing them to
        ``worker_id`` for ``lease_s`` seconds and counting one attempt each. Jobs
        pinned elsewhere (not to this id or one of ``tags``) are left alone."""

    @abc.abstractmethod
    def job_finalize_many(
        self, *, worker_id: str, outcomes: Sequence[Finalize], now: datetime | None = None
    ) -> list[int]:
        """Record the ends of ``worker_id``'s attempts; return the ids accepted. An
        outcome whose lease is no longer held changes nothing (fencing)."""

    @abc.abstractmethod
    def job_release_many(
        self, *, leases: Sequence[Lease], now: datetime | None = None
    ) -> list[int]:
        """Give running jobs back (graceful shutdown) without consuming an attempt."""

    @abc.abstractmethod
    def worker_heartbeat(
        self,
        *,
        worker: WorkerInfo,
        leases: Sequence[Lease],
        lease_s: float,
        now: datetime | None = None,
    ) -> Heartbeat:
        """Record the worker as alive and extend all its leases in one statement;
        report which are still held, which to cancel, and whether to stop."""

    @abc.abstractmethod
    def worker_deregister(self, *, worker_id: str) -> None: ...

    @abc.abstractmethod
    def worker_request_stop(self, *, worker_id: str) -> bool:
        """Ask a worker to drain and exit (it learns at its next heartbeat)."""

    @abc.abstractmethod
    def worker_list(self) -> list[WorkerInfo]: ...

    @abc.abstractmethod
    def worker_prune_stale(self, *, older_than_s: float, now: datetime | None = None) -> int:
        """Forget workers not seen for ``older_than_s`` (killed without deregistering).
        Their jobs are the rescuer's business; this only tidies the registry."""

    # -- jobs: maintenance ----------------------------------------------------------
    @abc.abstractmethod
    def job_rescue_expired(self, *, limit: int = 1000, now: datetime | None = None) -> RescueResult:
        """Jobs whose lease expired go back to available, or to failed when that was
        their last attempt (crash-loop protection)."""

    @abc.abstractmethod
    def job_schedule_due(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        """Move scheduled jobs whose time has come to available; return how many."""

    # -- jobs: inspection and operator actions --------------------------------------
    @abc.abstractmethod
    def job_get(self, *, job_id: int) -> Job | None: ...

    @abc.abstractmethod
    def job_list(
        self,
        *,
        queue: str | None = None,
        state: str | None = None,
        task: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
    ) -> list[Job]:
        """Newest first."""

    @abc.abstractmethod
    def job_attempts(self, *, job_id: int) -> list[Attempt]: ...

    @abc.abstractmethod
    def job_retry(self, *, job_id: int, now: datetime | None = None) -> bool:
        """A failed or cancelled job becomes available again (one more attempt allowed)."""

    @abc.abstractmethod
    def job_cancel(self, *, job_id: int, now: datetime | None = None) -> bool:
        """A job that has not started (scheduled or available) becomes cancelled."""

    @abc.abstractmethod
    def queue_counts(self) -> list[QueueCount]:
        """Number of jobs per queue and state."""

    @abc.abstractmethod
    def job_request_cancel(self, *, job_id: int) -> bool:
        """Flag a running job for cancellation; its worker cancels it."""

    # -- queues, aging, retention ----------------------------------------------------------
    @abc.abstractmethod
    def queue_set_paused(self, *, name: str, paused: bool, now: datetime | None = None) -> None:
        """A paused queue is skipped by every worker's claims; running jobs finish."""

    @abc.abstractmethod
    def queue_list(self) -> list[QueueInfo]: ...

    @abc.abstractmethod
    def queue_set_rate(
        self,
        *,
        name: str,
        rate_per_s: float | None,
        rate_burst: float | None,
        now: datetime | None = None,
    ) -> None:
        """A token bucket for the whole queue, shared by every worker (``None``: off)."""

    @abc.abstractmethod
    def queue_set_limit(
        self, *, name: str, max_running: int | None, now: datetime | None = None
    ) -> None:
        """At most ``max_running`` jobs of the queue run at once across all workers
        (``None``: no limit). Workers see a change within a second."""

    @abc.abstractmethod
    def job_age_priorities(
        self, *, aging_s: float, max_boost: int, limit: int = 1000, now: datetime | None = None
    ) -> int:
        """Raise waiting jobs' priority by one per ``aging_s`` waited (at most
        ``max_boost``); returns how many changed."""

    @abc.abstractmethod
    def job_prune(
        self,
        *,
        state: str,
        older_than_s: float,
        limit: int = 1000,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> int:
        """Delete (or, dry run, count) finished jobs in ``state`` older than the cutoff,
        with their attempts; never jobs of open batches or unadvanced chain links."""

    # -- batches ------------------------------------------------------------------------
    @abc.abstractmethod
    def batch_create(
        self,
        *,
        name: str | None,
        task: str,
        idempotency_key: str | None,
        on_complete_json: str | None,
        jobs: Sequence[JobInsert],
        conn: Any = None,
        now: datetime | None = None,
    ) -> tuple[int, bool]:
        """The batch row and its jobs in one transaction; ``(batch_id, created)``. An
        idempotency key seen before returns the existing batch and writes nothing."""

    @abc.abstractmethod
    def batch_get(self, *, batch_id: int) -> BatchRecord | None: ...

    @abc.abstractmethod
    def batch_list(
        self, *, state: str | None = None, limit: int = 50, before_id: int | None = None
    ) -> list[BatchRecord]:
        """Newest first."""

    @abc.abstractmethod
    def batch_progress(self, *, batch_id: int) -> dict[str, int]:
        """Jobs of the batch per state: one GROUP BY over the (batch_id, state) index."""

    @abc.abstractmethod
    def batch_finished_jobs(
        self, *, batch_id: int, after: tuple[datetime, int] | None = None, limit: int = 500
    ) -> list[Job]:
        """Finished jobs of the batch in order of (finished_at, id), after ``after``."""

    @abc.abstractmethod
    def batch_jobs(self, *, batch_id: int) -> list[Job]:
        """Every job of the batch, in creation order."""

    @abc.abstractmethod
    def batch_cancel(self, *, batch_id: int, now: datetime | None = None) -> int:
        """Cancel the batch's jobs that have not started; mark the batch cancelled once
        the aggregator closes it. Returns the number of jobs cancelled."""

    @abc.abstractmethod
    def batch_retry_failed(self, *, batch_id: int, now: datetime | None = None) -> int:
        """Failed jobs of the batch become available again and the batch reopens."""

    @abc.abstractmethod
    def batch_ready(self, *, limit: int = 100) -> list[int]:
        """Open batches with nothing scheduled, available or running."""

    @abc.abstractmethod
    def batch_close(self, *, batch_id: int, now: datetime | None = None) -> BatchRecord | None:
        """Count, decide the final state, and enqueue ``on_complete`` under an
        idempotency key, in one transaction. ``None`` if not (or no longer) ready."""

    # -- chains -------------------------------------------------------------------------
    @abc.abstractmethod
    def job_chain_append(self, *, job_id: int, steps_json: str) -> bool:
        """Add steps to run after the job; ``False`` if it was already advanced."""

    @abc.abstractmethod
    def job_chain_due(self, *, limit: int = 100) -> list[ChainLink]: ...

    @abc.abstractmethod
    def job_chain_advance(
        self, *, job_id: int, next_job: JobInsert | None, now: datetime | None = None
    ) -> int | None:
        """Enqueue the next step (or, with ``None``, end the chain) and link it to the
        job, in one transaction. Returns the next job's id."""

    # -- leadership -----------------------------------------------------------------------
    @abc.abstractmethod
    def leader_attempt_elect(
        self, *, name: str, holder: str, ttl_s: float, now: datetime | None = None
    ) -> bool:
        """Take or renew the lease on ``name``; ``True`` while ``holder`` holds it."""

    @abc.abstractmethod
    def leader_resign(self, *, name: str, holder: str) -> None: ...
