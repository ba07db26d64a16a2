"""The façade: the one door producers, workers, the CLI, the server, the
dashboard and integrations go through. ``Conveyor`` inherits nothing: it owns
one helper per concern (``database``, ``registry``, ``producing``, ``events``,
``actions``, ``queues``, ``diagnosis``, ``serving``, ``plumbing``), each typed
by a Protocol of what it calls on the app, and its public methods hand over to
them. What only Conveyor's own parts call is not here: the server and the
runtime use ``app.serving``, the handles ``app.plumbing``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, overload

from .actions import Actions
from .backends.interfaces import Backend
from .batch import Batch
from .checks import (
    DEFAULT_RETENTION,
    check_id,
    check_name,
    check_retention,
    check_tuning,
    make_filter,
)
from .cron import Periodic
from .database import Database, Replica
from .diagnosis import Diagnosis
from .durable import emit
from .errors import ConfigError
from .events import Events
from .flow import Chain, start_chain
from .hooks import Middleware, check_middleware
from .job import Job
from .plumbing import Plumbing
from .producing import Producer
from .queues import QueueControl
from .reading import Reads
from .records import (
    ActionRecord,
    ApiToken,
    Attempt,
    BulkResult,
    Change,
    ChangeCursor,
    Emitted,
    JobFilter,
    JobRecord,
    QueueCount,
    QueueInfo,
    TaskSettings,
    WorkerInfo,
    WorkflowRecord,
    WorkflowState,
)
from .registry import Registry
from .retry import Backoff
from .serving import Serving
from .task import P, R, Step, Task, TaskDecorator
from .workflow import Workflow, WorkflowRun

DEFAULT_URL = "sqlite:///conveyor.db"


class Conveyor:
    """A Conveyor application: a database URL and the tasks registered on it.

    ``Conveyor()`` reads ``CONVEYOR_DATABASE_URL``, else uses ``./conveyor.db``.
    The database is opened (and migrated, unless ``auto_migrate=False``) on first use.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        default_queue: str = "default",
        auto_migrate: bool = True,
        max_payload_bytes: int = 1 << 20,
        priority_aging_s: float | None = 60.0,
        priority_max_boost: int = 10,
        retention: dict[str, float | None] | None = None,
        vacuum_dead_rows: int | None = 50_000,
        middleware: Sequence[Middleware] = (),
        read_url: str | None = None,
    ) -> None:
        self.url = url or os.environ.get("CONVEYOR_DATABASE_URL") or DEFAULT_URL
        #: a streaming replica of the database, for what only reads: lists, counts,
        #: metrics, event streams and the dashboard (``reads``); None: the primary
        self.read_url = read_url
        check_name(default_queue, "default_queue")
        self.default_queue = default_queue
        self.auto_migrate = auto_migrate
        self.max_payload_bytes = max_payload_bytes
        #: a waiting job gains one priority point per priority_aging_s seconds, up to
        #: priority_max_boost points, so urgent traffic cannot starve it forever
        self.priority_aging_s = priority_aging_s
        self.priority_max_boost = priority_max_boost
        #: seconds finished jobs are kept, per state; None keeps them forever
        self.retention = {**DEFAULT_RETENTION, **check_retention(retention or {})}
        check_tuning(vacuum_dead_rows=vacuum_dead_rows, priority_aging_s=priority_aging_s)
        #: PostgreSQL: the leader VACUUMs a Conveyor table once this many dead rows
        #: (and 10% of its live ones) piled up; None leaves it all to autovacuum
        self.vacuum_dead_rows = vacuum_dead_rows
        self.tasks: dict[str, Task] = {}
        #: periodic (cron) schedules by name; every worker enqueues their ticks
        self.periodics: dict[str, Periodic] = {}
        self.middleware: list[Middleware] = []
        for m in middleware:
            self.add_middleware(m)
        #: the helpers the façade's methods hand over to, one per concern; ``serving``
        #: is also the door of the server and the runtime to tokens and remote workers
        self._registry = Registry(self)
        self.serving = Serving(self, lambda: self._db.opened, self._registry.task_for)
        self._db: Database = Database(self, self.serving.open_sensitive)
        self._replica = Database(Replica(self), lambda backend: None)
        self._events = Events(self)
        self._producer = Producer(self, self.serving, self._registry.task_for)
        self._actions = Actions(self, self._producer)
        self._diagnosis = Diagnosis(self)
        self._queues = QueueControl(self)
        self._reads = Reads(self, self.serving.before_shown)
        #: what the handles (tasks, jobs, batches, chains, workflows) are bound to
        self.plumbing = Plumbing(
            self,
            self._producer,
            self._events,
            self._actions,
            self._registry,
            lambda: self.serving.cached_task_settings(),
        )

    def __repr__(self) -> str:
        return f"<Conveyor {self.url} tasks={sorted(self.tasks)}>"

    # -- database --------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        """The database seam, for the façade, its helpers and the runtime only."""
        return self._db.get()

    @property
    def reads(self) -> Backend:
        """Where lists, counts and streams are read: the replica at ``read_url``, else
        the primary (Operations: Deployment)."""
        return self._replica.get() if self.read_url else self.backend

    def replica_lag(self) -> float | None:
        """Seconds the replica trails the primary; None without one or on SQLite, MySQL."""
        return self.reads.replica_lag() if self.read_url else None

    def connect(self, *, wait_s: float = 0.0) -> None:
        """Open (and migrate) the database now; one not answering yet (a transient
        ``DatabaseUnavailable``) is tried again for ``wait_s`` s (``--wait-for-database``)."""
        self._db.connect(wait_s)

    def migrate(self) -> list[int]:
        """Apply pending migrations (refusing a newer schema); return the versions applied."""
        return self._db.migrate()

    def schema_version(self) -> tuple[int, int]:
        """(the database's schema version, the newest this code knows)."""
        return self.backend.schema_version(), self.backend.latest_schema

    def close(self) -> None:
        self._events.reset()
        self.serving.reset()
        self._db.close()
        self._replica.close()

    def __enter__(self) -> Conveyor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tasks -------------------------------------------------------------------------
    @overload
    def task(self, fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        max_attempts: int = 5,
        timeout: float | None = None,
        backoff: Backoff | dict[str, float] | None = None,
        retry_on: Sequence[type[BaseException]] = (Exception,),
        classify: Callable[..., Any] | None = None,
        concurrency_key: str | Callable[..., str] | None = None,
        concurrency_limit: int | None = None,
        rate_limit: str | None = None,
        rate_burst: float | None = None,
        rate_key: str | Callable[..., str] | None = None,
        pinned_to: Sequence[str] | str | None = None,
        tenant_key: str | Callable[..., str] | None = None,
        sensitive: Sequence[str] = (),
    ) -> TaskDecorator: ...

    def task(  # type: ignore[misc]  # mypy misjudges a defaulted positional-only fn here
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        max_attempts: int = 5,
        timeout: float | None = None,
        backoff: Backoff | dict[str, float] | None = None,
        retry_on: Sequence[type[BaseException]] = (Exception,),
        classify: Callable[..., Any] | None = None,
        concurrency_key: str | Callable[..., str] | None = None,
        concurrency_limit: int | None = None,
        rate_limit: str | None = None,
        rate_burst: float | None = None,
        rate_key: str | Callable[..., str] | None = None,
        pinned_to: Sequence[str] | str | None = None,
        tenant_key: str | Callable[..., str] | None = None,
        sensitive: Sequence[str] = (),
    ) -> Task | TaskDecorator:
        """Register a handler (sync or async) as a task: ``@app.task`` or ``@app.task(...)``;
        the guides (Tasks, Flow control, Hooks) tell each option."""
        return self._registry.task(
            fn,
            name,
            sensitive,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            timeout=timeout,
            backoff=backoff,
            retry_on=retry_on,
            classify=classify,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            rate_limit=rate_limit,
            rate_burst=rate_burst,
            rate_key=rate_key,
            pinned_to=pinned_to,
            tenant_key=tenant_key,
        )

    def periodic(
        self,
        cron: str,
        *,
        timezone: str = "UTC",
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        missed: str = "skip",
        catch_up: int | None = None,
        grace_s: float = 60.0,
        **task_options: Any,
    ) -> Callable[[Callable[..., Any] | Task], Task]:
        """Run a task on a cron schedule: ``@app.periodic("*/5 * * * *")``; the
        Periodic guide tells the options (``missed``, ``catch_up``, ``grace_s``...)."""
        schedule: dict[str, Any] = {"cron": cron, "timezone": timezone, "args": args}
        schedule.update(kwargs=kwargs, missed=missed, catch_up=catch_up, grace_s=grace_s)
        return self._registry.periodic(name, schedule, task_options, lambda **o: self.task(**o))

    def add_middleware(self, middleware: Middleware) -> None:
        """Hook ``middleware`` into enqueue and execution (see ``conveyor.hooks``)."""
        self.middleware.append(check_middleware(middleware))

    # -- producing -------------------------------------------------------------------
    def enqueue(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """One job by task name (a task with no handler here gets default options);
        the options of ``send()``, plus ``tenant``."""
        return self._producer.enqueue(task, args, kwargs, options)

    def enqueue_many(
        self,
        task: str,
        items: Iterable[Sequence[Any] | Mapping[str, Any]],
        **options: Any,
    ) -> list[Job]:
        """Many jobs of one task by name, in one transaction (see ``Task.send_many``)."""
        return self._registry.task_for(task).send_many(items, **options)

    async def aenqueue(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """``enqueue`` off the event loop (``conn=`` as ``Task.asend`` takes it)."""
        return await self._producer.aenqueue(task, args, kwargs, options)

    # -- jobs --------------------------------------------------------------------------
    def get_job(self, job_id: int) -> Job:
        """The job, read now; ``JobNotFound`` if there is none."""
        return self._reads.get_job(job_id)

    async def aget_job(self, job_id: int) -> Job:
        return await asyncio.to_thread(self.get_job, job_id)

    def list_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        limit: int = 50,
        before_id: int | None = None,
        primary: bool = False,
        **fields: Any,
    ) -> list[Job]:
        """Jobs matching ``filter`` (or its fields as keywords), newest first, after the
        page ending at ``before_id``; from the replica if any, unless ``primary``."""
        return self._reads.list_jobs(filter, limit, before_id, primary, **fields)

    def count_jobs(
        self, filter: JobFilter | None = None, *, cap: int | None = None, **fields: Any
    ) -> dict[str, int]:
        """How many jobs match, per state. Queue, task and state filters are read from
        a rollup (no scan); any other filter counts, up to ``cap`` jobs if given."""
        return self.reads.job_count(filter=make_filter(filter, **fields), cap=cap)

    def job_attempts(self, job_id: int) -> list[Attempt]:
        """Every recorded attempt of the job, oldest first."""
        return self.backend.job_attempts(job_id=check_id(job_id, "job"))

    def wait_job(self, job_id: int, timeout: float | None = None) -> Job:
        """Block until the job is finished; return it. ``TimeoutError`` after ``timeout``."""
        return self._events.wait_job(job_id, timeout)

    async def await_job(self, job_id: int, timeout: float | None = None) -> Job:
        """``wait_job`` for async code: never blocks the event loop."""
        return await self._events.await_job(job_id, timeout)

    async def await_result(self, job_id: int, timeout: float | None = None) -> Any:
        """The job's result once it succeeds; ``JobFailed`` if it failed or was cancelled."""
        return (await self.await_job(job_id, timeout)).result_or_raise()

    # -- events (events.py) --------------------------------------------------------------
    def changes(
        self,
        after: str | ChangeCursor | None = None,
        filter: JobFilter | None = None,
        *,
        batches: bool = True,
        limit: int = 500,
        **fields: Any,
    ) -> tuple[list[Change], ChangeCursor]:
        """Changes of jobs and batches after the event id ``after`` (``None``: now), in
        commit order, and the cursor to read on from (missing and repeating nothing)."""
        return self._events.changes(after, filter, batches=batches, limit=limit, **fields)

    def stream_events(
        self,
        after: str | None = None,
        filter: JobFilter | None = None,
        *,
        batches: bool = True,
        progress: bool = True,
        until_batch_closed: int | None = None,
        limit: int = 500,
        debounce_s: float = 0.025,
        **fields: Any,
    ) -> AsyncIterator[dict[str, Any]]:
        """``changes`` as they happen, as ``serialize.change`` shapes, without blocking
        the event loop; ends once the batch ``until_batch_closed`` closes (Observability)."""
        return self._events.stream_events(
            after, filter, batches, progress, until_batch_closed, limit, debounce_s, **fields
        )

    # -- operator actions on jobs --------------------------------------------------------
    def retry_job(self, job_id: int) -> bool:
        """A failed or cancelled job runs again (one more attempt); False otherwise."""
        return self._actions.retry_job(job_id)

    def cancel_job(self, job_id: int) -> str | None:
        """``JobState.CANCELLED`` if it had not started, ``"requested"`` if it runs (its
        worker cancels it at its next heartbeat), ``None`` if it had finished."""
        return self._actions.cancel_job(job_id)

    def delete_job(self, job_id: int) -> bool:
        """Delete a job that is not running, with its attempts. False if it runs."""
        return self._actions.delete_job(job_id)

    def retry_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
        **fields: Any,
    ) -> BulkResult:
        """Retry every failed or cancelled job matching the filter, in transactions
        of 500. ``dry_run`` only counts. ``progress(done)`` after each slice."""
        return self._actions.retry_jobs(filter, dry_run=dry_run, progress=progress, **fields)

    def cancel_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
        **fields: Any,
    ) -> BulkResult:
        """Cancel every unfinished job matching the filter (running ones: as ``cancel_job``)."""
        return self._actions.cancel_jobs(filter, dry_run=dry_run, progress=progress, **fields)

    def delete_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
        **fields: Any,
    ) -> BulkResult:
        """Delete every job matching the filter that is not running, with its attempts."""
        return self._actions.delete_jobs(filter, dry_run=dry_run, progress=progress, **fields)

    def bulk_actions(self, *, limit: int = 50) -> list[ActionRecord]:
        """The audit log of bulk actions, newest first."""
        return self._actions.bulk_actions(limit=limit)

    # -- batches and chains ----------------------------------------------------------------
    def get_batch(self, batch_id: int) -> Batch:
        """The batch, read now; ``JobNotFound`` if there is none."""
        return self._reads.get_batch(batch_id)

    def list_batches(
        self, *, state: str | None = None, limit: int = 50, before_id: int | None = None
    ) -> list[Batch]:
        """Batches (in ``state``, if given), newest first."""
        return self._reads.list_batches(state, limit, before_id)

    def batch_progress(self, batch_id: int) -> dict[str, int]:
        """Jobs of the batch per state (from the per-batch counts the database keeps)."""
        return self.reads.batch_progress(batch_id=check_id(batch_id, "batch"))

    def batch_jobs(self, batch_id: int) -> list[Job]:
        """Every job of the batch, in item order."""
        return self._reads.batch_jobs(batch_id)

    def batch_finished_jobs(
        self, batch_id: int, *, after: tuple[datetime, int] | None = None, limit: int = 500
    ) -> list[Job]:
        """Finished jobs of the batch by (finished_at, id), after the cursor ``after``."""
        return self._reads.batch_finished_jobs(batch_id, after, limit)

    def cancel_batch(self, batch_id: int) -> int:
        """Cancel the batch's jobs not started yet; it closes as cancelled."""
        return self.backend.batch_cancel(batch_id=check_id(batch_id, "batch"))

    def retry_batch_failed(self, batch_id: int) -> int:
        """One more attempt for each failed job of the batch; it reopens."""
        return self.backend.batch_retry_failed(batch_id=check_id(batch_id, "batch"))

    def chain(self, *steps: Step | Task, conn: Any = None) -> Chain:
        """Run steps one after another, each receiving the previous result."""
        return start_chain(self.plumbing, steps, conn=conn)

    def get_chain(self, chain_id: int) -> Chain:
        return Chain(self.plumbing, int(chain_id))

    # -- workflows (workflow.py) ---------------------------------------------------------
    def workflow(self, name: str, *, idempotency_key: str | None = None) -> Workflow:
        """A graph to declare (``.add``, ``.map``) and then ``.start()``."""
        return Workflow(self.plumbing, name, idempotency_key)

    def get_workflow(self, workflow_id: int) -> WorkflowRun:
        """A started workflow, to follow or wait on; ``JobNotFound`` if there is none."""
        return WorkflowRun(self.plumbing, self.plumbing.workflow_record(workflow_id).id)

    def list_workflows(
        self, *, state: str | None = None, limit: int = 50, before_id: int | None = None
    ) -> list[WorkflowRecord]:
        """Newest first."""
        if state is not None and state not in set(WorkflowState):
            names = ", ".join(WorkflowState)
            raise ConfigError(f"state: unknown workflow state {state!r}; states are: {names}")
        return self.reads.workflow_list(state=state, limit=limit, before_id=before_id)

    def cancel_workflow(self, workflow_id: int) -> bool:
        """Cancel its nodes not started and its running jobs; ``False`` if it had ended."""
        return self.backend.workflow_cancel(
            workflow_id=self.plumbing.workflow_record(workflow_id).id
        )

    def retry_workflow(self, workflow_id: int) -> int:
        """Run an ended workflow's nodes that did not succeed again (the Workflows guide)."""
        record = self.plumbing.workflow_record(workflow_id)
        if record.state == WorkflowState.RUNNING:
            raise ConfigError(f"workflow {record.id} is still running: cancel it or let it end")
        return self.backend.workflow_retry(workflow_id=record.id)

    # -- queues --------------------------------------------------------------------------
    def queues(self) -> list[QueueInfo]:
        """Every queue that has jobs or settings, with its counts per state."""
        return self.reads.queue_list()

    def counts(self) -> list[QueueCount]:
        """Jobs per queue, task and state (a rollup kept as jobs change: no scan)."""
        return self.reads.queue_counts()

    def pause_queue(self, name: str, *, force: bool = False) -> None:
        """No worker claims from a paused queue; running jobs finish."""
        self._queues.set_paused(name, True, force)

    def resume_queue(self, name: str, *, force: bool = False) -> None:
        """Workers claim from the queue again."""
        self._queues.set_paused(name, False, force)

    def set_queue_limit(self, name: str, max_running: int | None, *, force: bool = False) -> None:
        """At most ``max_running`` jobs of the queue run at once (the Flow control guide)."""
        self._queues.set_limit(name, max_running, force)

    def set_queue_rate_limit(
        self, name: str, rate_limit: str | None, burst: float | None = None, *, force: bool = False
    ) -> None:
        """A rate limit for the whole queue, e.g. ``"100/m"`` (the Flow control guide)."""
        self._queues.set_rate_limit(name, rate_limit, burst, force)

    # -- workers -----------------------------------------------------------------------------
    def workers(
        self,
        *,
        limit: int | None = None,
        after: str | None = None,
        alive: bool | None = None,
        worker_ttl_s: float = 7.0,
    ) -> list[WorkerInfo]:
        """Registered workers (live or silent) by id, with the jobs each holds: up
        to ``limit`` (None: every one) after the id ``after``; ``alive`` True only
        those heard from within ``worker_ttl_s``, False only the silent ones."""
        return self.reads.worker_list(
            limit=limit, after_id=after or "", alive=alive, ttl_s=worker_ttl_s
        )

    def get_worker(self, worker_id: str) -> WorkerInfo:
        return self._reads.get_worker(worker_id)

    def stop_worker(self, worker_id: str) -> bool:
        """Ask a worker to drain and exit; it learns at its next heartbeat."""
        return self.backend.worker_request_stop(worker_id=worker_id)

    def unserved(self, *, worker_ttl_s: float = 7.0) -> list[QueueCount]:
        """Waiting jobs no live worker takes (their queue and task), per queue and task."""
        return self._diagnosis.unserved(worker_ttl_s=worker_ttl_s)

    def why_waiting(self, job_id: int, *, worker_ttl_s: float = 7.0) -> list[str]:
        """Why a waiting job does not run yet, from the engine's own state; empty when
        nothing holds it back (the Flow control and Troubleshooting pages)."""
        return self._diagnosis.why_waiting(job_id, worker_ttl_s=worker_ttl_s)

    # -- serving: settings, tokens, remote workers (serving.py) -------------------------
    def task_settings(self) -> list[TaskSettings]:
        """The settings of every task type that has some, by name."""
        return self.serving.task_settings()

    def get_task_settings(self, name: str) -> TaskSettings:
        """The task type's settings (every field ``None`` if it has none)."""
        return self.serving.get_task_settings(name)

    def set_task_settings(self, name: str, **fields: Any) -> TaskSettings:
        """Change settings of task type ``name`` (``None`` unsets one), its waiting jobs'
        too; returns the settings (the Server guide)."""
        return self.serving.set_task_settings(name, **fields)

    def delete_task_settings(self, name: str) -> bool:
        """Forget the task type's settings (its waiting jobs keep their values)."""
        return self.serving.delete_task_settings(name)

    def hide_arguments(self, task: str, parameters: Mapping[str, int | None]) -> None:
        """Every view hides these arguments of ``task``'s jobs (name -> position or None),
        as ``@app.task(sensitive=)`` does: for a task only remote workers run."""
        return self.serving.hide_arguments(task, parameters)

    def create_token(self, scope: str, *, name: str | None = None) -> tuple[ApiToken, str]:
        """A new API token and its secret text (``cvy_<id>_<secret>``), shown this once."""
        return self.serving.create_token(scope, name=name)

    def tokens(self) -> list[ApiToken]:
        """Every token (revoked ones too); never their secrets."""
        return self.serving.tokens()

    def revoke_token(self, token_id: str) -> bool:
        """False if there is no such active token; every server refuses it within 2 s."""
        return self.serving.revoke_token(token_id)

    # -- durable steps' events (durable.py) ------------------------------------------------
    def emit_event(self, key: str, payload: Any = None) -> Emitted:
        """Wake the jobs in ``wait_for_event(key)``, now or later; the first payload wins."""
        return emit(self.backend, key, payload)

    async def aemit_event(self, key: str, payload: Any = None) -> Emitted:
        """``emit_event`` without blocking the event loop."""
        return await asyncio.to_thread(emit, self.backend, key, payload)

    # -- maintenance ---------------------------------------------------------------------
    def prune(
        self, *, dry_run: bool = False, retention: dict[str, float | None] | None = None
    ) -> dict[str, int]:
        """Apply retention now (``dry_run``: only count what would go)."""
        keep = {**self.retention, **check_retention(retention or {})}
        return self._actions.prune(keep, dry_run=dry_run)


__all__ = ["Conveyor", "JobRecord", "make_filter"]
