"""The seam between Conveyor and a database, in small interfaces by concern.

Everything above this package speaks in domain verbs (``job_insert_many``,
``job_claim``, ``batch_close``, ...); everything below it is SQL, one folder per
dialect. One backend object implements every interface; each interface has its
own module in the conformance suite (``tests/backend/``).

The seam is synchronous: the worker calls it from dedicated threads, producers
call it directly, the async façade through ``asyncio.to_thread``. Every method
takes keyword arguments; those that depend on time take ``now`` (``None``: the
database's clock, so every machine of a cluster agrees), so tests can step time
without sleeping.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ..records import (
    ActionRecord,
    ApiToken,
    Attempt,
    BatchRecord,
    ChainLink,
    Change,
    ChangeCursor,
    Emitted,
    Finalize,
    Heartbeat,
    Inserted,
    JobFilter,
    JobInsert,
    JobRecord,
    Lease,
    QueueCount,
    QueueInfo,
    RescueResult,
    StepRecord,
    TaskSettings,
    WorkerInfo,
    WorkflowNode,
    WorkflowNodeSpec,
    WorkflowRecord,
)

#: what ``Backend.supports`` may be asked
CAPABILITIES = frozenset(
    {
        # wake-ups are pushed across processes at commit (LISTEN/NOTIFY); a rolled
        # back insert wakes nobody
        "push_notifications",
        # claims skip rows other claimers hold (SKIP LOCKED) instead of serialising
        "skip_locked",
        # the database is a server across a network, not a file in this process: it
        # can go down, be cut off, or end a session while the process runs
        "network",
    }
)


#: Between a queue and a worker's id in a work hint that worker's own outcomes
#: sent (``sent_by``).
SENDER = "\x1f"


def sent_by(queue: str, worker_id: str) -> str:
    """The work hint for ``queue`` that the outcomes of worker ``worker_id`` send.
    That worker claims again after each write of its outcomes anyway, so it skips
    this hint (a second claim on the same news finds nothing under a full limit);
    every other worker takes it as it takes ``queue``."""
    return f"{queue}{SENDER}{worker_id}"


class Notifier(abc.ABC):
    """A source of hints that a queue may have work. Hints may be lost or spurious:
    the worker always polls as well."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> set[str]:
        """Block up to ``timeout`` seconds; return the queues hinted at (may be empty),
        each a queue's name or ``sent_by(queue, worker_id)``. ``"*"`` means anything
        may have changed; ``"@flow"``, ``"@cancel"`` and ``"@done"`` hint at batches
        and chains, cancel or stop requests, finished jobs."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def pace(self, eager: bool) -> None:
        """Whether the consumer waits for a hint now (``eager``, the default) or is
        busy and will look for work without one (a worker claiming full batches):
        a notifier that polls may poll less often until it is eager again, and
        then looks at once. Only how soon a hint comes changes, never whether."""
        return None


class SchemaStore(abc.ABC):
    """Lifecycle and schema of the database."""

    name: str

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def supports(self, capability: str) -> bool:
        """Whether this backend has ``capability`` (one of ``CAPABILITIES``)."""

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
    def notifier(self, *, events: bool = False) -> Notifier:
        """A source of work hints, or with ``events`` of change hints (jobs finished)."""

    def replica_lag(self) -> float | None:
        """Seconds this database (a streaming replica) trails its primary: 0 once
        it replayed all it received, None on a primary or where it cannot tell."""
        return None


class JobStore(abc.ABC):
    """Creating jobs, reading them, and the operator's actions on them."""

    @abc.abstractmethod
    def job_insert_many(
        self, *, jobs: Sequence[JobInsert], conn: Any = None, now: datetime | None = None
    ) -> list[Inserted]:
        """Create jobs in one transaction (the caller's, if ``conn`` is given).
        Keys already in use return the existing job with ``created=False``."""

    def job_insert_stream(
        self, *, chunks: Iterable[Sequence[JobInsert]], now: datetime | None = None
    ) -> list[Inserted]:
        """Create jobs without keys or limits (the caller guarantees it) in one
        transaction of this backend's own, taking them from ``chunks`` as they
        come: a backend that can send a chunk and go on without waiting for it
        lets the caller encode the next one while the database writes this one.
        An exception from ``chunks`` rolls everything back. Ids come back in
        input order. This default takes every chunk first, then writes them.
        ``chunks`` may be taken while this backend holds a connection: making
        them must not use the database (a pool whose every connection is held
        so never gives a second one)."""
        return self.job_insert_many(jobs=[job for chunk in chunks for job in chunk], now=now)

    @abc.abstractmethod
    def job_get(self, *, job_id: int) -> JobRecord | None: ...

    @abc.abstractmethod
    def job_list(
        self, *, filter: JobFilter, limit: int = 50, before_id: int | None = None
    ) -> list[JobRecord]:
        """Jobs matching ``filter``, newest first; ``before_id`` is the keyset cursor
        (the last id of the previous page)."""

    @abc.abstractmethod
    def job_count(self, *, filter: JobFilter, cap: int | None = None) -> dict[str, int]:
        """Jobs matching ``filter`` per state (states with none are left out). A filter
        on queue, task and state only is read from the count rollup; any other is
        counted, stopping at ``cap`` jobs when given."""

    @abc.abstractmethod
    def job_attempts(self, *, job_id: int) -> list[Attempt]: ...

    @abc.abstractmethod
    def job_retry_many(
        self, *, filter: JobFilter, limit: int = 500, now: datetime | None = None
    ) -> list[int]:
        """Up to ``limit`` failed or cancelled jobs matching ``filter`` become available
        again, with one more attempt allowed; a cancel request is forgotten, a chain
        ended at the job is resumed and a closed batch reopened. Returns their ids."""

    @abc.abstractmethod
    def job_cancel_many(
        self, *, filter: JobFilter, limit: int = 500, now: datetime | None = None
    ) -> tuple[list[int], list[int]]:
        """Up to ``limit`` jobs matching ``filter``: those not started become
        cancelled, running ones are flagged (their worker cancels them).
        Returns (cancelled, flagged)."""

    @abc.abstractmethod
    def job_delete_many(self, *, filter: JobFilter, limit: int = 500) -> list[int]:
        """Delete up to ``limit`` jobs matching ``filter`` that are not running, with
        their attempts. Returns their ids."""


class LeaseStore(abc.ABC):
    """Claiming jobs, recording how attempts end, and the maintenance of leases."""

    @abc.abstractmethod
    def job_claim(
        self,
        *,
        queues: Sequence[str],
        worker_id: str,
        limit: int,
        tasks: Sequence[str] | None = None,
        tags: Sequence[str] = (),
        lease_s: float | None = None,
        schema_version: int | None = None,
        now: datetime | None = None,
    ) -> list[JobRecord]:
        """Claim up to ``limit`` due jobs, highest priority first, for ``worker_id``,
        counting one attempt each. Only jobs of ``tasks`` (``None``: any task); jobs
        pinned elsewhere (not to this id or one of ``tags``) are left alone.

        A claimed job is the worker's for as long as the worker heartbeats
        (``worker_heartbeat``); ``lease_s`` adds a deadline of its own (for clients
        that hold jobs without heartbeating). With ``schema_version`` older than the
        database's, nothing is claimed: old code must not bypass newer rules."""

    @abc.abstractmethod
    def job_finalize_many(
        self, *, worker_id: str, outcomes: Sequence[Finalize], now: datetime | None = None
    ) -> list[int]:
        """Record the ends of ``worker_id``'s attempts; return the ids accepted. An
        outcome whose lease is no longer held changes nothing (fencing)."""

    @abc.abstractmethod
    def job_outcome_written(self, *, outcome: Finalize, worker_id: str) -> bool:
        """Whether this exact outcome is already recorded (a write that committed
        just before the connection broke, sent again)."""

    @abc.abstractmethod
    def job_release_many(
        self, *, worker_id: str, leases: Sequence[Lease], now: datetime | None = None
    ) -> list[int]:
        """Give running jobs back (graceful shutdown) without consuming an attempt;
        the attempt log records the release."""

    @abc.abstractmethod
    def job_rescue(
        self, *, worker_ttl_s: float, limit: int = 1000, now: datetime | None = None
    ) -> RescueResult:
        """Running jobs whose worker went silent for ``worker_ttl_s`` (or whose own
        deadline passed) go back to available, or to failed when that was their
        last attempt (crash-loop protection)."""

    @abc.abstractmethod
    def job_schedule_due(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        """Move scheduled jobs whose time has come to available; return how many."""

    @abc.abstractmethod
    def job_age_priorities(
        self,
        *,
        aging_s: float,
        max_boost: int,
        limit: int = 1000,
        window_s: float | None = None,
        now: datetime | None = None,
    ) -> int:
        """Raise waiting jobs' priority by one per ``aging_s`` waited (at most
        ``max_boost``); returns how many changed (at most ``limit``: call again
        while it returns ``limit``). ``window_s``: only jobs whose age crossed a
        multiple of ``aging_s`` in the last ``window_s`` seconds (a pass after the
        previous one, index ranges only); ``None``: every waiting job."""

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

    def tidy(self, *, min_dead: int = 50_000, dead_fraction: float = 0.1) -> list[str]:
        """Reclaim what updates and deletes left behind in Conveyor's tables, and
        refresh the planner's statistics, when the database has not done it itself:
        a table with at least ``min_dead`` dead rows (or rows changed since its
        statistics were taken) and ``dead_fraction`` of its live ones. Returns the
        tables tidied. Only PostgreSQL needs it (VACUUM, ANALYZE); SQLite reuses
        freed pages and InnoDB purges."""
        return []


class WorkerStore(abc.ABC):
    """The registry of live workers, and single-holder leadership."""

    @abc.abstractmethod
    def worker_heartbeat(self, *, worker: WorkerInfo, now: datetime | None = None) -> Heartbeat:
        """Record the worker as alive (one row, whatever it runs) and report what it
        holds, which of its jobs to cancel, whether to stop, and the schema version."""

    @abc.abstractmethod
    def worker_deregister(self, *, worker_id: str) -> None: ...

    @abc.abstractmethod
    def worker_request_stop(self, *, worker_id: str) -> bool:
        """Ask a worker to drain and exit (it learns at its next heartbeat)."""

    @abc.abstractmethod
    def worker_list(
        self,
        *,
        limit: int | None = None,
        after_id: str = "",
        alive: bool | None = None,
        ttl_s: float = 7.0,
        now: datetime | None = None,
    ) -> list[WorkerInfo]:
        """Registered workers by id, each with the number of jobs it holds: up to
        ``limit`` (None: all) after ``after_id``; ``alive`` True only those heard
        from within ``ttl_s``, False only the others."""

    @abc.abstractmethod
    def worker_count(self, *, ttl_s: float = 7.0, now: datetime | None = None) -> dict[str, int]:
        """How many registered workers were heard from within ``ttl_s`` (``alive``)
        and how many were not (``silent``), counted in the database."""

    @abc.abstractmethod
    def worker_prune_stale(self, *, older_than_s: float, now: datetime | None = None) -> int:
        """Forget workers not seen for ``older_than_s`` (killed without deregistering)."""

    @abc.abstractmethod
    def leader_attempt_elect(
        self, *, name: str, holder: str, ttl_s: float, now: datetime | None = None
    ) -> bool:
        """Take or renew the lease on ``name``; ``True`` while ``holder`` holds it."""

    @abc.abstractmethod
    def leader_resign(self, *, name: str, holder: str) -> None: ...


class QueueStore(abc.ABC):
    """Queue settings (pause, limits) and counts."""

    @abc.abstractmethod
    def queue_set_paused(self, *, name: str, paused: bool, now: datetime | None = None) -> None:
        """A paused queue is skipped by every worker's claims; running jobs finish."""

    @abc.abstractmethod
    def queue_set_limit(
        self, *, name: str, max_running: int | None, now: datetime | None = None
    ) -> None:
        """At most ``max_running`` jobs of the queue run at once across all workers
        (``None``: no limit). Workers see a change within a second."""

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
    def queue_list(self) -> list[QueueInfo]:
        """Every queue that has jobs or settings, with its counts per state."""

    @abc.abstractmethod
    def queue_counts(self) -> list[QueueCount]:
        """Number of jobs per queue, task and state, from the count rollup (no scan)."""

    @abc.abstractmethod
    def queue_oldest_waiting(self, *, now: datetime | None = None) -> dict[str, datetime]:
        """Per queue with jobs waiting, when its oldest due job became due."""

    @abc.abstractmethod
    def counts_fold(self) -> None:
        """Fold the count deltas statements appended into the rollup (the leader)."""


class FlowStore(abc.ABC):
    """Batches and chains."""

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
        fingerprint: str | None = None,
    ) -> tuple[int, bool]:
        """The batch row and its jobs in one transaction; ``(batch_id, created)``. An
        idempotency key seen before returns the existing batch and writes nothing.
        ``fingerprint`` (what the batch was asked for, hashed) is kept on the row
        (``BatchRecord.fingerprint``): the caller compares a repeat's with it."""

    @abc.abstractmethod
    def batch_create_stream(
        self,
        *,
        name: str | None,
        task: str,
        on_complete_json: str | None,
        total: int,
        chunks: Callable[[int], Iterable[Sequence[JobInsert]]],
        now: datetime | None = None,
    ) -> int:
        """``batch_create`` of ``total`` jobs without keys or limits and with no
        idempotency key for the batch, in one transaction; the batch's id. The
        jobs are ``chunks(batch_id)``'s, made with that id: a backend may write
        the batch row first and each chunk while the next is made (PostgreSQL),
        or make them all first with ``chunks(0)`` and set the id itself. A count
        other than ``total`` writes nothing. As in ``job_insert_stream``, making
        the chunks must not use the database."""

    @abc.abstractmethod
    def batch_get(self, *, batch_id: int) -> BatchRecord | None: ...

    @abc.abstractmethod
    def batch_list(
        self, *, state: str | None = None, limit: int = 50, before_id: int | None = None
    ) -> list[BatchRecord]:
        """Newest first."""

    @abc.abstractmethod
    def batch_progress(self, *, batch_id: int) -> dict[str, int]:
        """Jobs of the batch per state, from the per-batch rollup (schema v16): a few
        rows whatever the batch's size, exact (the deltas not folded yet included)."""

    @abc.abstractmethod
    def batch_finished_jobs(
        self, *, batch_id: int, after: tuple[datetime, int] | None = None, limit: int = 500
    ) -> list[JobRecord]:
        """Finished jobs of the batch in order of (finished_at, id), after ``after``."""

    @abc.abstractmethod
    def batch_jobs(self, *, batch_id: int) -> list[JobRecord]:
        """Every job of the batch, in creation order."""

    @abc.abstractmethod
    def batch_cancel(self, *, batch_id: int, now: datetime | None = None) -> int:
        """Cancel the batch's jobs that have not started; mark the batch cancelled once
        the aggregator closes it. Returns the number of jobs cancelled."""

    @abc.abstractmethod
    def batch_retry_failed(self, *, batch_id: int, now: datetime | None = None) -> int:
        """Failed jobs of the batch become available again and the batch reopens."""

    @abc.abstractmethod
    def batch_count_open(self) -> int:
        """Batches not closed yet."""

    @abc.abstractmethod
    def batch_first_finished(self, *, batch_id: int) -> datetime | None:
        """When the first job of the batch finished."""

    @abc.abstractmethod
    def batch_ready(self, *, limit: int = 100) -> list[int]:
        """Open batches with nothing scheduled, available or running."""

    @abc.abstractmethod
    def batch_close(self, *, batch_id: int, now: datetime | None = None) -> BatchRecord | None:
        """Count, decide the final state, and enqueue ``on_complete`` under an
        idempotency key, in one transaction. ``None`` if not (or no longer) ready."""

    @abc.abstractmethod
    def job_chain_append(self, *, job_id: int, steps_json: str) -> bool:
        """Add steps to run after the job; ``False`` if it was already advanced."""

    @abc.abstractmethod
    def job_chain_due(self, *, limit: int = 100) -> list[ChainLink]: ...

    @abc.abstractmethod
    def job_chain_advance(
        self,
        *,
        job_id: int,
        next_job: JobInsert | None,
        state: str,
        now: datetime | None = None,
    ) -> int | None:
        """Enqueue the next step (or, with ``None``, end the chain) and link it to the
        job, in one transaction, if the job is still in ``state`` (the state
        ``job_chain_due`` read; it may have been retried since). Returns the next
        job's id, or None if nothing was linked."""


class WorkflowStore(abc.ABC):
    """Workflows: graphs of nodes whose jobs the flow leader makes as parents end."""

    @abc.abstractmethod
    def workflow_create(
        self,
        *,
        name: str,
        nodes: Sequence[WorkflowNodeSpec],
        idempotency_key: str | None = None,
        fingerprint: str | None = None,
        conn: Any = None,
        now: datetime | None = None,
    ) -> tuple[int, bool]:
        """The workflow, its nodes and the jobs of its root nodes in one transaction
        (``conn``'s, if given); ``(workflow_id, created)``. An idempotency key seen
        before returns that workflow and writes nothing."""

    @abc.abstractmethod
    def workflow_get(self, *, workflow_id: int) -> WorkflowRecord | None: ...

    @abc.abstractmethod
    def workflow_list(
        self, *, state: str | None = None, limit: int = 50, before_id: int | None = None
    ) -> list[WorkflowRecord]:
        """Newest first."""

    @abc.abstractmethod
    def workflow_nodes(self, *, workflow_id: int) -> list[WorkflowNode]:
        """The declared nodes, in declaration order."""

    @abc.abstractmethod
    def workflow_items(self, *, workflow_id: int, node: int) -> list[WorkflowNode]:
        """A map node's items, in item order."""

    @abc.abstractmethod
    def workflow_item_counts(self, *, workflow_id: int, node: int) -> dict[str, int]:
        """A map node's items per state (states with none left out)."""

    @abc.abstractmethod
    def workflow_settle(self, *, links: Sequence[ChainLink], now: datetime | None = None) -> int:
        """For finished jobs of workflow nodes whose end is not recorded yet (their
        chain link is open): record it, make the dependents that became ready (each
        once), end the workflow when nothing is left; mark the links done. Jobs of
        no workflow just have their link closed. Returns the links closed."""

    @abc.abstractmethod
    def workflow_cancel(self, *, workflow_id: int, now: datetime | None = None) -> bool:
        """Nodes not started are cancelled, running ones' jobs cancelled (or flagged);
        the run ends cancelled when they have. ``False`` if it had ended."""

    @abc.abstractmethod
    def workflow_retry(self, *, workflow_id: int, now: datetime | None = None) -> int:
        """An ended, failed or cancelled workflow runs again: its failed, cancelled
        and skipped nodes (a map: only its items that did not succeed) run anew,
        what succeeded is kept. The number of nodes reset; 0 if it succeeded."""

    @abc.abstractmethod
    def workflow_prune(
        self, *, state: str, older_than_s: float, limit: int = 500, now: datetime | None = None
    ) -> int:
        """Delete up to ``limit`` workflows (and their nodes) that ended in ``state``
        more than ``older_than_s`` ago; how many went."""


class CronStore(abc.ABC):
    """What periodic schedules need remembered across workers."""

    @abc.abstractmethod
    def cron_first_seen(
        self, *, names: Sequence[str], now: datetime | None = None
    ) -> dict[str, datetime]:
        """When each schedule was first seen by any worker (recorded now for new
        ones): ticks from before a schedule existed are never enqueued."""


class ChangeStore(abc.ABC):
    """Changes of jobs and batches in the order they committed, for event streams."""

    @abc.abstractmethod
    def changes_head(self) -> ChangeCursor:
        """A cursor just before any change not yet committed: where "from now" starts."""

    @abc.abstractmethod
    def changes_since(
        self, *, after: ChangeCursor, filter: JobFilter, batches: bool = True, limit: int = 500
    ) -> list[Change]:
        """Up to ``limit`` changes after ``after``, in order: jobs matching ``filter``
        and (with ``batches``) batches (``filter.batch_id``: that one only). A change
        is given only once every transaction that could commit before it has ended,
        so reading again from the last cursor misses nothing and repeats nothing."""


class ServerStore(abc.ABC):
    """What only the HTTP server needs stored (as River UI keeps its own small
    driver beside River's): API tokens, per-task-type settings, and deadlines of
    jobs held by remote clients."""

    @abc.abstractmethod
    def token_insert(
        self, *, token: ApiToken, secret_hash: str, now: datetime | None = None
    ) -> None:
        """Store a new token; only the hash of its secret is kept."""

    @abc.abstractmethod
    def token_find(self, *, token_id: str) -> tuple[ApiToken, str] | None:
        """The token and the hash of its secret, to compare with what a client sent."""

    @abc.abstractmethod
    def token_list(self) -> list[ApiToken]:
        """Every token, revoked ones too, oldest first."""

    @abc.abstractmethod
    def token_revoke(self, *, token_id: str, now: datetime | None = None) -> bool:
        """False if there is no such active token."""

    @abc.abstractmethod
    def token_count_active(self) -> int: ...

    @abc.abstractmethod
    def token_count_all(self) -> int:
        """Every token ever created, revoked ones too (they are kept as rows)."""

    @abc.abstractmethod
    def action_insert(
        self,
        *,
        action_id: str,
        action: str,
        filter_json: str,
        actor: str | None,
        matched: int,
        jobs: Sequence[JobInsert] = (),
        now: datetime | None = None,
    ) -> list[Inserted]:
        """Record a bulk action that starts now (state running), and write ``jobs``
        (the job that runs it) in the same transaction, never one without the
        other: what ``job_insert_many`` would return for them."""

    @abc.abstractmethod
    def action_update(
        self,
        *,
        action_id: str,
        done: int,
        requested: int,
        state: str,
        error: str | None = None,
        now: datetime | None = None,
    ) -> None:
        """Its progress, or its end (state done or failed)."""

    @abc.abstractmethod
    def action_list(self, *, limit: int = 50) -> list[ActionRecord]:
        """Newest first."""

    @abc.abstractmethod
    def action_get(self, *, action_id: str) -> ActionRecord | None: ...

    @abc.abstractmethod
    def task_settings_list(self) -> list[TaskSettings]: ...

    @abc.abstractmethod
    def task_settings_get(self, *, task: str) -> TaskSettings | None: ...

    @abc.abstractmethod
    def task_settings_set(
        self, *, settings: TaskSettings, backoff_json: str | None, now: datetime | None = None
    ) -> int:
        """Store the task's settings (every field, unset ones as NULL) and apply them,
        in the same transaction, to its waiting jobs not sent with explicit values
        (``backoff_json``: the backoff the retry fields make, or ``None``). Returns
        how many waiting jobs were updated."""

    @abc.abstractmethod
    def task_settings_delete(self, *, task: str) -> bool:
        """Forget the task's settings (waiting jobs keep the values they have)."""

    @abc.abstractmethod
    def task_sensitive_list(self) -> dict[str, dict[str, int | None]]:
        """Every task's sensitive parameters: task -> {name: its position among the
        positional parameters, or None}. ``JobFilter.search`` never looks inside
        their values."""

    @abc.abstractmethod
    def task_sensitive_add(self, *, task: str, parameters: Mapping[str, int | None]) -> None:
        """Record parameters of ``task`` as sensitive (a name already recorded takes
        the new position; none is ever forgotten)."""

    @abc.abstractmethod
    def job_set_deadline(
        self, *, leases: Sequence[Lease], seconds: float, now: datetime | None = None
    ) -> int:
        """Running jobs held under these leases are rescued ``seconds`` from now even
        if their worker still heartbeats (remote holders' max processing time)."""


class DurableStore(abc.ABC):
    """Durable steps inside one job (``current_job().step``, ``sleep``,
    ``wait_for_event``) and the events they wait for. Writes of steps are fenced
    by the lease token like outcomes: ``None`` when the attempt no longer holds
    the job."""

    @abc.abstractmethod
    def step_list(self, *, job_id: int, now: datetime | None = None) -> list[StepRecord]:
        """The job's stored steps, in the order they were first stored."""

    @abc.abstractmethod
    def step_save(
        self,
        *,
        job_id: int,
        token: str,
        name: str,
        kind: str,
        result_json: str | None = None,
        wake_in_s: float | None = None,
        now: datetime | None = None,
    ) -> StepRecord | None:
        """Store a step (``kind`` step, with its result; or sleep, ending
        ``wake_in_s`` from now) unless one of that name is stored already; return
        the stored one either way (the first write wins)."""

    @abc.abstractmethod
    def step_wait(
        self,
        *,
        job_id: int,
        token: str,
        name: str,
        key: str,
        timeout_s: float | None,
        now: datetime | None = None,
    ) -> StepRecord | None:
        """The wait ``name`` for event ``key``: done with the event's payload if it
        exists (taken once, kept with the step), timed out if its deadline (set on
        the first call, ``timeout_s`` from then; ``None``: none) has passed, else
        open, with the seconds left."""

    @abc.abstractmethod
    def event_emit(
        self, *, key: str, payload_json: str | None, now: datetime | None = None
    ) -> Emitted:
        """Store the event (the first for its key wins), then make the jobs waiting
        for it available."""

    @abc.abstractmethod
    def event_wake_waiters(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        """Make available the scheduled jobs whose open wait has its event (the
        leader's pass: it closes the race of an emit with a waiter's outcome)."""

    @abc.abstractmethod
    def event_prune(
        self, *, older_than_s: float, limit: int = 1000, now: datetime | None = None
    ) -> int:
        """Delete events older than ``older_than_s``, and the steps whose job is gone."""


class Backend(
    SchemaStore,
    JobStore,
    LeaseStore,
    WorkerStore,
    QueueStore,
    FlowStore,
    WorkflowStore,
    CronStore,
    ChangeStore,
    ServerStore,
    DurableStore,
):
    """Every interface: what ``open_backend`` returns."""
