"""The façade: the one door producers, workers, the CLI, the server, the
dashboard and integrations go through. Nothing outside this module and the
backends touches a backend."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import inspect
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, overload

from . import serialize
from .backends import open_backend, waits
from .backends.interfaces import Backend
from .batch import Batch
from .cron import Periodic
from .errors import ConfigError, DatabaseUnavailable, JobNotFound, SchemaError, SchemaTooNew
from .flow import Chain, start_chain
from .hooks import Middleware, run_enqueue_hooks
from .job import Job
from .records import (
    ActionRecord,
    Attempt,
    BatchState,
    BulkResult,
    Change,
    ChangeCursor,
    Inserted,
    JobFilter,
    JobInsert,
    JobRecord,
    JobState,
    QueueCount,
    QueueInfo,
    WorkerInfo,
)
from .retry import Backoff
from .serving import SENSITIVE_SCHEMA, ServingMixin
from .task import Step, Task, TaskDefaults, check_queue_name
from .waiter import ChangeWaiter

log = logging.getLogger("conveyor")
#: the (args, kwargs) each insert was encoded from, reused for the jobs' handles
Payloads = Sequence[tuple[Sequence[Any], Mapping[str, Any]]]

DEFAULT_URL = "sqlite:///conveyor.db"
DAY = 86400.0
DEFAULT_RETENTION: dict[str, float | None] = {
    JobState.SUCCEEDED: 7 * DAY,
    JobState.FAILED: 30 * DAY,
    JobState.CANCELLED: 7 * DAY,
}
MAX_INT32 = 2**31 - 1
MAX_RETENTION_S = 100 * 365 * DAY
#: rows a bulk action changes per transaction
BULK_CHUNK = 500


class Conveyor(ServingMixin):
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
    ) -> None:
        self.url = url or os.environ.get("CONVEYOR_DATABASE_URL") or DEFAULT_URL
        check_queue_name(default_queue)
        self.default_queue = default_queue
        self.auto_migrate = auto_migrate
        self.max_payload_bytes = max_payload_bytes
        #: a waiting job gains one priority point per priority_aging_s seconds, up to
        #: priority_max_boost points, so urgent traffic cannot starve it forever
        self.priority_aging_s = priority_aging_s
        self.priority_max_boost = priority_max_boost
        #: seconds finished jobs are kept, per state; None keeps them forever
        self.retention = {**DEFAULT_RETENTION, **_check_retention(retention or {})}
        #: PostgreSQL: the leader VACUUMs a Conveyor table once this many dead rows
        #: (and 10% of its live ones) piled up; None leaves it all to autovacuum
        if vacuum_dead_rows is not None and (
            not isinstance(vacuum_dead_rows, int)
            or isinstance(vacuum_dead_rows, bool)
            or vacuum_dead_rows < 1
        ):
            raise ConfigError(
                f"vacuum_dead_rows must be a positive number of rows or None, got "
                f"{vacuum_dead_rows!r}"
            )
        self.vacuum_dead_rows = vacuum_dead_rows
        if priority_aging_s is not None and priority_aging_s <= 0:
            raise ConfigError(f"priority_aging_s must be > 0 or None, got {priority_aging_s}")
        self.tasks: dict[str, Task] = {}
        #: periodic (cron) schedules by name; every worker enqueues their ticks
        self.periodics: dict[str, Periodic] = {}
        self.middleware: list[Middleware] = []
        for m in middleware:
            self.add_middleware(m)
        self._remote: dict[str, Task] = {}
        #: what this app's tasks declare sensitive, recorded whenever the database opens
        self._sensitive: dict[str, dict[str, int | None]] = {}
        self._backend: Backend | None = None
        self._lock = threading.Lock()
        self._waiter = ChangeWaiter(lambda: self.backend)
        #: server-side state: settings and token caches, the work waiter (serving.py)
        self._serving = self._serving_state()

    def __repr__(self) -> str:
        return f"<Conveyor {self.url} tasks={sorted(self.tasks)}>"

    # -- database --------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        """The database seam. For the façade's own use and the runtime's; clients
        (CLI, server, integrations) call the façade's methods instead."""
        if self._backend is None:
            with self._lock:
                if self._backend is None:
                    backend = open_backend(self.url)
                    try:
                        self._prepare(backend)
                    except BaseException:
                        backend.close()
                        raise
                    self._backend = backend
        return self._backend

    def connect(self, *, wait_s: float = 0.0) -> None:
        """Open the database now (migrating it, or checking its schema). One that
        does not answer yet (``DatabaseUnavailable.transient``: refused, starting
        up, restarting) is tried again with backoff for up to ``wait_s`` seconds,
        said once in the log; any other error, or one past that time, is raised.
        What ``conveyor worker`` and ``conveyor server`` do at start
        (``--wait-for-database``)."""
        deadline = time.monotonic() + wait_s
        began, delay = time.monotonic(), 0.25
        while True:
            try:
                self.backend  # noqa: B018 - opens it
            except DatabaseUnavailable as exc:
                left = deadline - time.monotonic()
                if not exc.transient or left <= 0:
                    raise
                if delay == 0.25:
                    log.warning(
                        "the database does not answer yet; trying again for up to %.0fs "
                        "(--wait-for-database): %s",
                        left,
                        exc,
                    )
                time.sleep(min(delay, left))
                delay = min(delay * 2, 5.0)
                continue
            if delay > 0.25:
                log.warning("the database answers, after %.1fs", time.monotonic() - began)
            return

    def _prepare(self, backend: Backend) -> None:
        if self.auto_migrate:
            backend.migrate()  # also refuses a schema newer than this code
            self._open_sensitive(backend)
            return
        version = backend.schema_version()
        if version == 0:
            raise SchemaError(f"no Conveyor schema in {self.url}: run `conveyor migrate` first")
        if version > backend.latest_schema:
            raise SchemaTooNew(
                f"{self.url} has schema version {version}, but this Conveyor only knows up to "
                f"version {backend.latest_schema}: upgrade the conveyor package"
            )
        if version >= SENSITIVE_SCHEMA:
            self._open_sensitive(backend)

    def migrate(self) -> list[int]:
        """Apply pending migrations (refusing a newer schema); return the versions applied."""
        with self._lock:
            if self._backend is not None:
                applied = self._backend.migrate()
                self._open_sensitive(self._backend)
                return applied
            backend = open_backend(self.url)
            try:
                applied = backend.migrate()
                self._open_sensitive(backend)
            except BaseException:
                backend.close()
                raise
            self._backend = backend
            return applied

    def bounded_waits(self, seconds: float) -> AbstractContextManager[None]:
        """Within this block, and the threads it hands calls to through asyncio or
        anyio, a call waits at most ``seconds`` for a database connection (a free
        one from PostgreSQL's pool, a new one to MySQL), then raises
        ``DatabaseUnavailable``: a server's request handler answers 503 at once
        while the database is down, instead of after the pool's 30 s. Outside
        it, calls wait as long as they always did (workers, which retry)."""
        return waits.bounded(seconds)

    def schema_version(self) -> tuple[int, int]:
        """(the database's schema version, the newest this code knows)."""
        return self.backend.schema_version(), self.backend.latest_schema

    def close(self) -> None:
        self._waiter.close()
        self._waiter = ChangeWaiter(lambda: self.backend)
        self._serving.work.close()
        self._serving = self._serving_state()
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def __enter__(self) -> Conveyor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tasks -------------------------------------------------------------------------
    @overload
    def task(self, fn: Callable[..., Any], /) -> Task: ...

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
    ) -> Callable[[Callable[..., Any]], Task]: ...

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
    ) -> Task | Callable[[Callable[..., Any]], Task]:
        """Register a handler (sync or async) as a task. ``@app.task`` or ``@app.task(...)``.

        ``retry_on``: exceptions that are retried; any other exception, or
        ``conveyor.Permanent``, fails the job at once. ``classify(exc, job)`` may
        decide otherwise per exception: ``conveyor.Retry(delay=, max_attempts=)``,
        ``conveyor.Fail()``, ``conveyor.Snooze(s)`` or ``None`` (the default rule).
        ``concurrency_key`` + ``concurrency_limit``: at most that many jobs with the
        same key run at once across the cluster. The key is the name of one of the
        handler's parameters (the key is then ``"<name>=<value>"``, shared by every
        task keyed on that name) or a callable taking the job's arguments.
        ``rate_limit="100/m"``: a token bucket shared by every worker through the
        database; ``rate_burst`` tokens at most (default: one second's worth, at
        least 1); one bucket per task unless ``rate_key`` names a parameter or is
        a callable. Jobs over the limit wait, without using attempts.
        ``pinned_to``: worker ids or tags (``conveyor worker --tags gpu``); only a
        worker with one of them runs these jobs (also a ``send()`` option).
        ``tenant_key``: a parameter (or callable) whose value is stored as the job's
        tenant, to filter jobs by user or customer.
        ``sensitive``: names of parameters whose values every view hides (the API,
        the dashboard, the CLI show ``***``); the handler still receives them.
        """
        defaults = TaskDefaults(
            queue=queue or self.default_queue,
            priority=priority,
            max_attempts=max_attempts,
            timeout=timeout,
            backoff=Backoff.coerce(backoff) or Backoff(),
            retry_on=tuple(retry_on),
            classify=classify,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            rate_limit=rate_limit,
            rate_burst=rate_burst,
            rate_key=rate_key,
            pinned_to=(pinned_to,)
            if isinstance(pinned_to, str)
            else (tuple(pinned_to) if pinned_to is not None else None),
            tenant_key=tenant_key,
        )

        def register(f: Callable[..., Any]) -> Task:
            task_name = name or getattr(f, "__name__", None)
            if not task_name:
                raise ConfigError(f"cannot name task {f!r}: pass name=")
            if task_name in self.tasks:
                other = self.tasks[task_name].fn
                raise ConfigError(
                    f"task name {task_name!r} is already registered by "
                    f"{getattr(other, '__module__', '?')}.{getattr(other, '__qualname__', '?')}; "
                    "pass name= to tell them apart"
                )
            hidden = _sensitive_parameters(f, task_name, sensitive)
            t = Task(self, f, task_name, defaults)
            self.tasks[task_name] = t
            if hidden:
                self.hide_arguments(task_name, hidden)
            return t

        return register(fn) if fn is not None else register

    def get_task(self, name: str) -> Task | None:
        return self.tasks.get(name)

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
        """Run a task on a cron schedule: ``@app.periodic("*/5 * * * *", timezone="Europe/Paris")``.

        Registers the function as a task (``task_options`` go to ``app.task``; an
        existing ``Task`` of this app is scheduled as it is) and returns the Task.
        Every worker enqueues due ticks under one idempotency key per tick, so each
        tick is one job however many workers run. Missed ticks: ``missed="skip"``
        runs those at most ``grace_s`` old; ``catch_up=N`` the N most recent.
        ``name`` (default: the function's) names the schedule, its keys and the new
        task; with an existing task, only the schedule.
        """

        def register(f: Callable[..., Any] | Task) -> Task:
            if isinstance(f, Task):
                if f.app is not self:
                    raise ConfigError(f"task {f.name!r} belongs to another Conveyor app")
                if task_options:
                    raise ConfigError(
                        f"task {f.name!r} is already registered: pass its options to "
                        f"@app.task, not to periodic() ({sorted(task_options)})"
                    )
            if isinstance(f, Task):
                task_name = f.name
            else:  # a new task is named like its schedule
                task_name = name or getattr(f, "__name__", None) or "?"
                task_options["name"] = task_name
            p = Periodic(  # checks the schedule before anything is registered
                task=task_name,
                cron=cron,
                timezone=timezone,
                args=args,  # checked, and made a tuple, there
                kwargs=kwargs if kwargs is not None else {},
                missed=missed,
                catch_up=catch_up,
                grace_s=grace_s,
                name=name or task_name,
            )
            if p.name in self.periodics:
                raise ConfigError(
                    f"a periodic named {p.name!r} is already registered; pass name= to "
                    "tell the schedules apart"
                )
            t = f if isinstance(f, Task) else self.task(**task_options)(f)
            try:
                t.build(p.args, p.kwargs)  # arguments fit the handler and are JSON: fail now
            except Exception:
                if t is not f:
                    del self.tasks[t.name]
                raise
            self.periodics[p.name] = dataclasses.replace(p, task=t)
            return t

        return register

    def add_middleware(self, middleware: Middleware) -> None:
        """Hook ``middleware`` into enqueue and execution (see ``conveyor.hooks``)."""
        if not isinstance(middleware, Middleware):
            raise ConfigError(
                f"middleware must subclass conveyor.Middleware, got {type(middleware).__name__}"
            )
        self.middleware.append(middleware)

    # -- producing -------------------------------------------------------------------
    def insert_jobs(
        self,
        inserts: Sequence[JobInsert],
        *,
        conn: Any = None,
        payloads: Payloads | None = None,
    ) -> list[Job]:
        """Write prepared jobs; returns handles in input order. ``payloads`` are the
        (args, kwargs) the inserts were encoded from, reused for the handles. Jobs
        whose key named an existing job come back as that job, read fresh, with
        ``created=False``."""
        inserts = self._settle(inserts)  # per-task-type settings fill in what was not sent
        if self.middleware:
            changed = run_enqueue_hooks(self.middleware, list(inserts))
            if len(changed) != len(inserts):
                raise ConfigError("an on_enqueue hook must return one job per job it was given")
            inserts = changed
        now = datetime.now(UTC)
        results = self.backend.job_insert_many(jobs=inserts, conn=conn)
        jobs = self._handles(inserts, results, payloads, now)
        for m in self.middleware:
            m.on_enqueued(jobs)
        return jobs

    def insert_stream(self, chunks: Iterable[tuple[Sequence[JobInsert], Payloads]]) -> list[Job]:
        """Write jobs without keys or limits (the caller guarantees it), each chunk
        with the (args, kwargs) its inserts were encoded from, in one transaction:
        the backend may write a chunk while the next one is encoded. With enqueue
        hooks (which see every job before any is written) it is ``insert_jobs``."""
        if self.middleware:
            inserts: list[JobInsert] = []
            payloads: list[tuple[Sequence[Any], Mapping[str, Any]]] = []
            for chunk, paid in chunks:
                inserts.extend(chunk)
                payloads.extend(paid)
            return self.insert_jobs(inserts, payloads=payloads)

        now = datetime.now(UTC)
        handles = _Handles(self, now)
        unbound: list[Job] = []
        settle = self._settler()  # not in settled(): the backend holds a connection there

        def settled() -> Iterator[Sequence[JobInsert]]:
            for chunk, paid in chunks:
                chunk = settle(chunk)
                yield chunk
                # The backend asks for the next chunk once this one is sent: the
                # handles' fields are built while the server writes it (on
                # PostgreSQL, 20,000 handles took 90 of a send_many's 300 ms after
                # the commit, with the server idle).
                for ins, (args, kwargs) in zip(chunk, paid, strict=True):
                    unbound.append(handles.unbound(ins, args, kwargs))

        with _collection_paused():
            results = self.backend.job_insert_stream(chunks=settled())
        if len(results) != len(unbound):
            raise RuntimeError(f"the backend wrote {len(results)} jobs of {len(unbound)}")
        return [job.bind(res.id) for job, res in zip(unbound, results, strict=True)]

    def _handles(
        self,
        inserts: Sequence[JobInsert],
        results: Sequence[Inserted],
        payloads: Payloads | None,
        now: datetime,
    ) -> list[Job]:
        """The handles of written jobs, in input order: built from what was sent
        for the jobs this call created, read back for the ones a key named."""
        jobs = []
        handles = _Handles(self, now)
        for n, (ins, res) in enumerate(zip(inserts, results, strict=True)):
            existing = None if res.created else self.backend.job_get(job_id=res.id)
            if existing is not None:
                jobs.append(Job.of(existing, self, created=False))
                continue
            if payloads is not None:
                args, kwargs = payloads[n]
            else:
                decoded = json.loads(ins.args_json)
                args, kwargs = decoded["args"], decoded["kwargs"]
            jobs.append(handles.unbound(ins, args, kwargs).bind(res.id))
        return jobs

    def task_for(self, name: str) -> Task:
        """The task named ``name``: the registered one, else a stand-in with default
        options for a task this process has no handler for (remote workers, or
        another app's workers, run it)."""
        task = self.tasks.get(name)
        if task is not None:
            return task
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise ConfigError(
                f"a task name is a non-empty string of at most 200 characters, got {name!r}"
            )
        remote = self._remote.get(name)
        if remote is None:
            remote = Task(self, None, name, TaskDefaults(queue=self.default_queue))
            self._remote[name] = remote
        return remote

    def enqueue(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """Enqueue one job by task name (the CLI and the HTTP API use this). A task
        with no handler here is enqueued with default options; its arguments are
        checked against the handler only when it is registered. Options are those
        of ``send()``, plus ``tenant``."""
        conn = options.pop("conn", None)
        insert = self.task_for(task).build(args, kwargs or {}, **options)
        return self.insert_jobs([insert], conn=conn, payloads=[(args, kwargs or {})])[0]

    def enqueue_many(
        self,
        task: str,
        items: Iterable[Sequence[Any] | Mapping[str, Any]],
        **options: Any,
    ) -> list[Job]:
        """Many jobs of one task by name, in one transaction (see ``Task.send_many``)."""
        return self.task_for(task).send_many(items, **options)

    async def aenqueue(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        return await asyncio.to_thread(self.enqueue, task, args, kwargs, **options)

    # -- jobs --------------------------------------------------------------------------
    def get_job(self, job_id: int) -> Job:
        record = self.backend.job_get(job_id=_id(job_id, "job"))
        if record is None:
            raise JobNotFound(f"no job with id {job_id}")
        self._before_shown([record])
        return Job.of(record, self)

    async def aget_job(self, job_id: int) -> Job:
        return await asyncio.to_thread(self.get_job, job_id)

    def list_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        limit: int = 50,
        before_id: int | None = None,
        **fields: Any,
    ) -> list[Job]:
        """Jobs matching ``filter`` (or the same fields as keywords: ``state=``,
        ``queue=``, ``task=`` are accepted as singular aliases), newest first.
        ``before_id``: the last id of the previous page."""
        f = make_filter(filter, **fields)
        if not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise ConfigError(f"limit must be an integer from 1 to 10000, got {limit!r}")
        records = self.backend.job_list(filter=f, limit=limit, before_id=before_id)
        self._before_shown(records)
        return [Job.of(r, self) for r in records]

    async def alist_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        limit: int = 50,
        before_id: int | None = None,
        **fields: Any,
    ) -> list[Job]:
        return await asyncio.to_thread(
            self.list_jobs, filter, limit=limit, before_id=before_id, **fields
        )

    def count_jobs(
        self, filter: JobFilter | None = None, *, cap: int | None = None, **fields: Any
    ) -> dict[str, int]:
        """How many jobs match, per state. Queue, task and state filters are read from
        a rollup (no scan); any other filter counts, up to ``cap`` jobs if given."""
        return self.backend.job_count(filter=make_filter(filter, **fields), cap=cap)

    def job_attempts(self, job_id: int) -> list[Attempt]:
        """Every recorded attempt of the job, oldest first."""
        return self.backend.job_attempts(job_id=_id(job_id, "job"))

    def wait_job(self, job_id: int, timeout: float | None = None) -> Job:
        """Block until the job is finished; return it. ``TimeoutError`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            generation = self._waiter.generation
            job = self.get_job(job_id)
            if job.state.finished:
                return job
            remaining = 3600.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"job {job_id} still {job.state} after {timeout}s")
            self._waiter.wait(generation, remaining)

    async def await_job(self, job_id: int, timeout: float | None = None) -> Job:
        """``wait_job`` for async code: never blocks the event loop."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            generation = self._waiter.generation
            job = await self.aget_job(job_id)
            if job.state.finished:
                return job
            remaining = 3600.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"job {job_id} still {job.state} after {timeout}s")
            await self._waiter.await_change(generation, remaining)

    async def await_result(self, job_id: int, timeout: float | None = None) -> Any:
        """The job's result once it succeeds; ``JobFailed`` if it failed or was cancelled."""
        return (await self.await_job(job_id, timeout)).result_or_raise()

    def wait_for_change(self, generation: int, timeout: float) -> None:
        """Block until the database hints at a change after ``generation``
        (``change_generation()``), at most ``timeout`` (and at most a second)."""
        self._waiter.wait(generation, timeout)

    def change_generation(self) -> int:
        return self._waiter.generation

    # -- events --------------------------------------------------------------------------
    def changes(
        self,
        after: str | ChangeCursor | None = None,
        filter: JobFilter | None = None,
        *,
        batches: bool = True,
        limit: int = 500,
        **fields: Any,
    ) -> tuple[list[Change], ChangeCursor]:
        """Changes of jobs (matching the filter) and batches after the event id
        ``after`` (``None``: from now), in commit order; and the cursor to read
        from next. Reading again from that cursor misses nothing and repeats
        nothing, for as long as the changed rows are kept."""
        cursor = self._cursor(after)
        found = self.backend.changes_since(
            after=cursor, filter=make_filter(filter, **fields), batches=batches, limit=limit
        )
        return found, (found[-1].cursor if found else cursor)

    def _cursor(self, after: str | ChangeCursor | None) -> ChangeCursor:
        if after is None:
            return self.backend.changes_head()
        return after if isinstance(after, ChangeCursor) else ChangeCursor.parse(after)

    async def stream_events(
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
        """Events (``serialize.change`` shapes) as they happen, from the event id
        ``after`` (``None``: from now), woken by the database's hints (a burst of
        changes costs a read per ``debounce_s``, not one per change) and polling
        once a second as the safety net. With ``progress``, each batch whose jobs
        changed gets a ``batch.progress`` event after them. Ends after the batch
        ``until_batch_closed`` closes; followed from now, that batch's stream starts
        with its progress so far (and ends there if it is closed already). Never
        blocks the event loop.

        Each job and batch is given as its latest change left it: a stream that
        falls behind (or resumes later) skips the states a job has since left."""
        async for page in self.stream_event_pages(
            after,
            filter,
            batches=batches,
            progress=progress,
            until_batch_closed=until_batch_closed,
            limit=limit,
            debounce_s=debounce_s,
            **fields,
        ):
            for event in page:
                yield event

    async def stream_event_pages(
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
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """``stream_events`` a page at a time (what one read of the database found:
        a server sends it as one write), and an empty page at least once a second
        while nothing happens (a server's cue for a keep-alive)."""
        f = make_filter(filter, **fields)
        cursor = await asyncio.to_thread(self._cursor, after)
        if until_batch_closed is not None and after is None:
            # a new follower of one batch starts from where it stands (read after the
            # head: the events that follow are never older than this snapshot)
            batch = await asyncio.to_thread(self.get_batch, until_batch_closed)
            first = [serialize.progress_event(str(cursor), batch.id, batch.progress())]
            if batch.finished:
                data = serialize.batch(batch.record)
                first.append({"id": str(cursor), "event": "batch.closed", "data": data})
            yield first if progress else first[1:]
            if batch.finished:
                return
        while True:
            generation = self._waiter.generation
            last_read = time.monotonic()
            found, cursor = await asyncio.to_thread(
                self.changes, cursor, f, batches=batches, limit=limit
            )
            page, closed = await self._event_page(found, progress, until_batch_closed)
            yield page
            if closed:
                return
            if len(found) < limit:
                await self._waiter.await_change(generation, 1.0)
                # at most one read per debounce_s: a burst gathers, a lone change is
                # read at once
                await asyncio.sleep(max(0.0, last_read + debounce_s - time.monotonic()))

    async def _event_page(
        self, found: list[Change], progress: bool, until_batch_closed: int | None
    ) -> tuple[list[dict[str, Any]], bool]:
        """The events of one read, with the progress of each batch whose jobs changed
        in it. A progress event carries the id of the event just before it: a client
        resuming from it misses nothing and receives nothing twice."""
        page: list[dict[str, Any]] = []
        touched: set[int] = set()
        closed = False
        at = ""
        for c in found:
            if c.batch is not None and c.batch.id in touched and progress:
                touched.discard(c.batch.id)  # its progress before its closing
                page.append(await self._progress_event(c.batch.id, at))
            page.append(serialize.change(c))
            at = str(c.cursor)
            if c.job is not None and c.job.batch_id is not None:
                touched.add(c.job.batch_id)
            if c.batch is not None and c.batch.id == until_batch_closed:
                closed = c.batch.state != BatchState.RUNNING
        if progress:
            for batch_id in sorted(touched):
                page.append(await self._progress_event(batch_id, at))
        return page, closed

    async def _progress_event(self, batch_id: int, at: str) -> dict[str, Any]:
        counts = await asyncio.to_thread(lambda: self.get_batch(batch_id).progress())
        return serialize.progress_event(at, batch_id, counts)

    # -- operator actions on jobs --------------------------------------------------------
    def retry_job(self, job_id: int) -> bool:
        """A failed or cancelled job runs again (one more attempt allowed). False if
        the job is in any other state."""
        f = JobFilter(ids=(_id(job_id, "job"),))
        return bool(self.backend.job_retry_many(filter=f, limit=1))

    def cancel_job(self, job_id: int) -> str | None:
        """Cancel a job wherever it is: ``JobState.CANCELLED`` if it had not started,
        ``"requested"`` if it is running (its worker cancels it at its next
        heartbeat), ``None`` if it had already finished."""
        f = JobFilter(ids=(_id(job_id, "job"),))
        for _ in range(5):  # the job may move between the two checks: look again
            cancelled, requested = self.backend.job_cancel_many(filter=f, limit=1)
            if cancelled:
                return JobState.CANCELLED
            if requested:
                return "requested"
            job = self.get_job(job_id)
            if job.state.finished:
                return None
            if job.state == JobState.RUNNING and job.cancel_requested:
                return "requested"
        return None

    def delete_job(self, job_id: int) -> bool:
        """Delete a job that is not running, with its attempts. False if it runs."""
        self.get_job(job_id)  # a missing id is an error of its own
        f = JobFilter(ids=(_id(job_id, "job"),))
        return bool(self.backend.job_delete_many(filter=f, limit=1))

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
        f = make_filter(filter, **fields)
        retryable = (JobState.FAILED, JobState.CANCELLED)
        matched = _matching(self.count_jobs(f), retryable)
        if dry_run:
            return BulkResult("retry", f, matched, dry_run=True)
        done = 0
        while True:
            ids = self.backend.job_retry_many(filter=f, limit=BULK_CHUNK)
            done += len(ids)
            if progress:
                progress(done)
            if len(ids) < BULK_CHUNK:
                break
        return BulkResult("retry", f, matched, done)

    def cancel_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
        **fields: Any,
    ) -> BulkResult:
        """Cancel every unfinished job matching the filter: waiting ones now, running
        ones at their worker's next heartbeat."""
        f = make_filter(filter, **fields)
        active = (JobState.SCHEDULED, JobState.AVAILABLE, JobState.RUNNING)
        matched = _matching(self.count_jobs(f), active)
        if dry_run:
            return BulkResult("cancel", f, matched, dry_run=True)
        done = requested = 0
        while True:
            cancelled, flagged = self.backend.job_cancel_many(filter=f, limit=BULK_CHUNK)
            done += len(cancelled)
            requested += len(flagged)
            if progress:
                progress(done + requested)
            if len(cancelled) + len(flagged) < BULK_CHUNK:
                break
        return BulkResult("cancel", f, matched, done, requested)

    def delete_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
        **fields: Any,
    ) -> BulkResult:
        """Delete every job matching the filter that is not running, with its attempts."""
        f = make_filter(filter, **fields)
        deletable = tuple(s for s in JobState if s != JobState.RUNNING)
        matched = _matching(self.count_jobs(f), deletable)
        if dry_run:
            return BulkResult("delete", f, matched, dry_run=True)
        done = 0
        while True:
            ids = self.backend.job_delete_many(filter=f, limit=BULK_CHUNK)
            done += len(ids)
            if progress:
                progress(done)
            if len(ids) < BULK_CHUNK:
                break
        return BulkResult("delete", f, matched, done)

    def start_bulk(
        self, action: str, filter: JobFilter, *, actor: str | None = None
    ) -> ActionRecord:
        """Run ``retry``, ``cancel`` or ``delete`` of every job matching ``filter`` in
        the background (a thread of this process), in the same bounded transactions as
        ``retry_jobs`` and the others, recording who asked, what it matched and how
        far it got (``bulk_action``, ``bulk_actions``: the audit log)."""
        run = self.bulk_method(action)
        matched = run(filter, dry_run=True).matched
        action_id = uuid.uuid4().hex[:16]
        described = serialize.job_filter(filter)
        self.backend.action_insert(
            action_id=action_id,
            action=action,
            filter_json=json.dumps(described),
            actor=actor,
            matched=matched,
        )
        last = [time.monotonic()]

        def progress(done: int) -> None:
            if time.monotonic() - last[0] >= 0.5:  # a write per half second at most
                last[0] = time.monotonic()
                self.backend.action_update(
                    action_id=action_id, done=done, requested=0, state="running"
                )

        def work() -> None:
            try:
                result = run(filter, progress=progress)
            except Exception as exc:  # recorded, for the person who asked to see
                log.exception("bulk %s %s failed", action, action_id)
                self.backend.action_update(
                    action_id=action_id, done=0, requested=0, state="failed", error=str(exc)
                )
                return
            self.backend.action_update(
                action_id=action_id,
                done=result.done,
                requested=result.requested,
                state="done",
            )

        threading.Thread(target=work, name=f"conveyor-bulk-{action_id}", daemon=True).start()
        return self.bulk_action(action_id)

    def bulk_method(self, action: str) -> Callable[..., BulkResult]:
        """``retry_jobs``, ``cancel_jobs`` or ``delete_jobs``, by the action's name."""
        methods = {"retry": self.retry_jobs, "cancel": self.cancel_jobs, "delete": self.delete_jobs}
        if action not in methods:
            raise ConfigError(f"unknown bulk action {action!r}; actions are: retry, cancel, delete")
        return methods[action]

    def bulk_action(self, action_id: str) -> ActionRecord:
        record = self.backend.action_get(action_id=str(action_id))
        if record is None:
            raise JobNotFound(f"no bulk action with id {action_id}")
        return record

    def bulk_actions(self, *, limit: int = 50) -> list[ActionRecord]:
        """The audit log of bulk actions, newest first."""
        if not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise ConfigError(f"limit must be an integer from 1 to 1000, got {limit!r}")
        return self.backend.action_list(limit=limit)

    # -- batches and chains ----------------------------------------------------------------
    def get_batch(self, batch_id: int) -> Batch:
        record = self.backend.batch_get(batch_id=_id(batch_id, "batch"))
        if record is None:
            raise JobNotFound(f"no batch with id {batch_id}")
        return Batch(record, True, self)

    def list_batches(
        self, *, state: str | None = None, limit: int = 50, before_id: int | None = None
    ) -> list[Batch]:
        if state is not None:
            try:
                BatchState(state)
            except ValueError:
                names = ", ".join(s.value for s in BatchState)
                raise ConfigError(f"unknown batch state {state!r}; states are: {names}") from None
        records = self.backend.batch_list(state=state, limit=limit, before_id=before_id)
        return [Batch(r, True, self) for r in records]

    def create_batch(
        self,
        *,
        name: str | None,
        task: str,
        idempotency_key: str | None,
        on_complete_json: str | None,
        jobs: Sequence[JobInsert],
        conn: Any = None,
    ) -> tuple[int, bool]:
        """The batch row and its jobs in one transaction (``Task.batch`` builds them)."""
        jobs = self._settle(jobs)
        if self.middleware:
            jobs = run_enqueue_hooks(self.middleware, list(jobs))
        return self.backend.batch_create(
            name=name,
            task=task,
            idempotency_key=idempotency_key,
            on_complete_json=on_complete_json,
            jobs=jobs,
            conn=conn,
        )

    def create_batch_stream(
        self,
        *,
        name: str | None,
        task: str,
        on_complete_json: str | None,
        total: int,
        chunks: Callable[[int], Iterable[Sequence[JobInsert]]],
    ) -> int:
        """``create_batch`` for ``total`` jobs without keys or limits and no
        idempotency key, with no enqueue hooks to see them first (the caller
        checks all three), made by ``chunks(batch_id)`` once the batch row is
        written: the backend may write a chunk while the next is made."""
        if self.middleware:
            raise RuntimeError("create_batch_stream: enqueue hooks must see every job first")
        settle = self._settler()  # not in settled(): the backend holds a connection there

        def settled(batch_id: int) -> Iterator[Sequence[JobInsert]]:
            for chunk in chunks(batch_id):
                yield settle(chunk)

        return self.backend.batch_create_stream(
            name=name, task=task, on_complete_json=on_complete_json, total=total, chunks=settled
        )

    def batch_progress(self, batch_id: int) -> dict[str, int]:
        """Jobs of the batch per state (from the per-batch counts the database keeps)."""
        return self.backend.batch_progress(batch_id=_id(batch_id, "batch"))

    def batch_jobs(self, batch_id: int) -> list[Job]:
        """Every job of the batch, in item order."""
        return [Job.of(r, self) for r in self.backend.batch_jobs(batch_id=_id(batch_id, "batch"))]

    def batch_finished_jobs(
        self, batch_id: int, *, after: tuple[datetime, int] | None = None, limit: int = 500
    ) -> list[Job]:
        """Finished jobs of the batch by (finished_at, id), after the cursor ``after``."""
        records = self.backend.batch_finished_jobs(
            batch_id=_id(batch_id, "batch"), after=after, limit=limit
        )
        self._before_shown(records)
        return [Job.of(r, self) for r in records]

    def cancel_batch(self, batch_id: int) -> int:
        """Cancel the batch's jobs not started yet; it closes as cancelled."""
        return self.backend.batch_cancel(batch_id=_id(batch_id, "batch"))

    def retry_batch_failed(self, batch_id: int) -> int:
        """One more attempt for each failed job of the batch; it reopens."""
        return self.backend.batch_retry_failed(batch_id=_id(batch_id, "batch"))

    def append_to_chain(self, job_id: int, steps_json: str) -> bool:
        """Add steps after a chain's last job; False if it was advanced meanwhile."""
        return self.backend.job_chain_append(job_id=_id(job_id, "job"), steps_json=steps_json)

    def chain(self, *steps: Step | Task, conn: Any = None) -> Chain:
        """Run steps one after another, each receiving the previous result."""
        return start_chain(self, steps, conn=conn)

    def get_chain(self, chain_id: int) -> Chain:
        return Chain(self, int(chain_id))

    # -- queues --------------------------------------------------------------------------
    def queues(self) -> list[QueueInfo]:
        """Every queue that has jobs or settings, with its counts per state."""
        return self.backend.queue_list()

    def counts(self) -> list[QueueCount]:
        """Jobs per queue, task and state (a rollup kept as jobs change: no scan)."""
        return self.backend.queue_counts()

    def oldest_waiting(self) -> dict[str, datetime]:
        """Per queue with jobs waiting, when its oldest due job became due."""
        return self.backend.queue_oldest_waiting()

    def open_batches(self) -> int:
        return self.backend.batch_count_open()

    def batch_first_finished(self, batch_id: int) -> datetime | None:
        """When the batch's first job finished (its first result)."""
        return self.backend.batch_first_finished(batch_id=_id(batch_id, "batch"))

    def _known_queue(self, name: str, force: bool) -> None:
        check_queue_name(name)
        if force:
            return
        known = {t.defaults.queue for t in self.tasks.values()} | {self.default_queue}
        if name in known:
            return
        known |= {q.name for q in self.queues()}
        if name not in known:
            raise ConfigError(
                f"no queue named {name!r} (known: {', '.join(sorted(known))}); "
                "check the name, or pass force=True (--force) to set up a queue before "
                "it has jobs"
            )

    def pause_queue(self, name: str, *, force: bool = False) -> None:
        """No worker claims from a paused queue; running jobs finish."""
        self._known_queue(name, force)
        self.backend.queue_set_paused(name=name, paused=True)

    def resume_queue(self, name: str, *, force: bool = False) -> None:
        self._known_queue(name, force)
        self.backend.queue_set_paused(name=name, paused=False)

    def set_queue_limit(self, name: str, max_running: int | None, *, force: bool = False) -> None:
        """At most ``max_running`` jobs of queue ``name`` run at once across every
        worker (``None`` removes the limit). Workers apply a change within a second."""
        if max_running is not None and (
            not isinstance(max_running, int)
            or isinstance(max_running, bool)
            or not 0 <= max_running <= MAX_INT32
        ):
            raise ConfigError(
                f"max_running must be an integer from 0 to {MAX_INT32}, or None; "
                f"got {max_running!r}"
            )
        self._known_queue(name, force)
        self.backend.queue_set_limit(name=name, max_running=max_running)

    def set_queue_rate_limit(
        self, name: str, rate_limit: str | None, burst: float | None = None, *, force: bool = False
    ) -> None:
        """A token bucket for the whole queue, e.g. ``"100/m"``, shared by every
        worker; ``burst`` tokens at most (default one second's worth, at least 1).
        ``None`` removes it. Workers apply a change within a second."""
        from .task import parse_rate

        rate = None if rate_limit is None else parse_rate(rate_limit)
        if burst is not None and (
            isinstance(burst, bool) or not isinstance(burst, int | float) or burst < 1
        ):
            raise ConfigError(f"burst must be a number >= 1, got {burst!r}")
        if rate is not None and burst is None:
            burst = max(1.0, rate)
        self._known_queue(name, force)
        self.backend.queue_set_rate(
            name=name, rate_per_s=rate, rate_burst=None if rate is None else float(burst or 1)
        )

    # -- workers -----------------------------------------------------------------------------
    def workers(self) -> list[WorkerInfo]:
        """Every registered worker (live or silent), with the jobs it holds."""
        return self.backend.worker_list()

    def get_worker(self, worker_id: str) -> WorkerInfo:
        found = next((w for w in self.workers() if w.id == worker_id), None)
        if found is None:
            raise JobNotFound(f"no worker with id {worker_id!r}")
        return found

    def stop_worker(self, worker_id: str) -> bool:
        """Ask a worker to drain and exit; it learns at its next heartbeat."""
        return self.backend.worker_request_stop(worker_id=worker_id)

    def unserved(self, *, worker_ttl_s: float = 7.0) -> list[QueueCount]:
        """Waiting jobs that no live worker can run (no live worker takes their
        queue and task), per queue and task: they wait, visibly, until one does."""
        live = self._live_workers(worker_ttl_s)
        out = []
        for c in self.counts():
            if c.state not in (JobState.AVAILABLE, JobState.SCHEDULED) or not c.count:
                continue
            if not any(_serves(w, c.queue, c.task) for w in live):
                out.append(c)
        return out

    def _live_workers(self, worker_ttl_s: float) -> list[WorkerInfo]:
        """Workers whose heartbeat is at most ``worker_ttl_s`` old."""
        now = datetime.now(UTC)
        return [
            w
            for w in self.workers()
            if w.last_seen_at is not None and (now - w.last_seen_at).total_seconds() <= worker_ttl_s
        ]

    def why_waiting(self, job_id: int, *, worker_ttl_s: float = 7.0) -> list[str]:
        """Why a job that waits is not running, read from the engine's own state: a
        paused queue, a full limit, a later time, pinning to workers that are not
        alive, a chain step before it, no live worker for its queue and task. Empty
        when the job runs, has ended, or nothing holds it back."""
        job = self.get_job(job_id)
        if job.state not in (JobState.SCHEDULED, JobState.AVAILABLE):
            return []
        now = datetime.now(UTC)
        reasons = []
        if job.scheduled_at > now:
            when = job.scheduled_at.isoformat(timespec="seconds")
            why = "a retry waits out its backoff" if job.attempts else "it was sent to run later"
            reasons.append(f"scheduled for {when}: {why}")
        queue = next((q for q in self.queues() if q.name == job.queue), None)
        if queue is not None and queue.paused:
            reasons.append(f"queue {job.queue!r} is paused")
        if queue is not None and queue.max_running is not None:
            running = queue.counts.get(JobState.RUNNING, 0)
            if running >= queue.max_running:
                reasons.append(
                    f"queue {job.queue!r} is at its limit: {running} running of {queue.max_running}"
                )
        serving = [w for w in self._live_workers(worker_ttl_s) if _serves(w, job.queue, job.task)]
        if job.pinned_to:
            pins = set(job.pinned_to)
            if not [w for w in serving if w.id in pins or pins & set(w.tags)]:
                reasons.append(
                    f"pinned to {', '.join(sorted(pins))}: no live worker with that id or tag "
                    "serves its queue"
                )
        if job.chain_root is not None and job.chain_root != job.id and job.attempts == 0:
            reasons.append(f"a step of chain {job.chain_root}: it runs after the step before it")
        if not serving:
            reasons.append(
                f"no live worker takes queue {job.queue!r} and task {job.task!r} "
                "(start one with `conveyor worker`)"
            )
        return reasons

    # -- maintenance ---------------------------------------------------------------------
    def prune(
        self, *, dry_run: bool = False, retention: dict[str, float | None] | None = None
    ) -> dict[str, int]:
        """Apply retention now: finished jobs older than their state's retention go,
        in small batches. ``dry_run`` only counts them."""
        keep = {**self.retention, **_check_retention(retention or {})}
        pruned: dict[str, int] = {}
        for state, keep_s in keep.items():
            if keep_s is None:
                continue
            total = 0
            while True:
                n = self.backend.job_prune(
                    state=state, older_than_s=keep_s, limit=500, dry_run=dry_run
                )
                total += n
                if dry_run or n < 500:
                    break
            pruned[str(state)] = total
            if total and not dry_run:
                log.info("pruned %d %s job(s) older than %gs", total, state, keep_s)
        return pruned


# -- helpers -----------------------------------------------------------------------------
_ALIASES = {"state": "states", "queue": "queues", "task": "tasks", "id": "ids"}


def make_filter(filter: JobFilter | None = None, **fields: Any) -> JobFilter:
    """A ``JobFilter`` from one, or from keyword fields (``state=JobState.FAILED`` and the
    other singular aliases too); ``None`` values are ignored."""
    given = {_ALIASES.get(k, k): v for k, v in fields.items() if v is not None}
    unknown = set(given) - {f.name for f in dataclasses.fields(JobFilter)}
    if unknown:
        raise ConfigError(f"unknown job filter field(s) {sorted(unknown)}")
    if filter is None:
        return JobFilter(**given)
    return dataclasses.replace(filter, **given) if given else filter


def _matching(counts: Mapping[str, int], states: Iterable[str]) -> int:
    return sum(counts.get(str(s), 0) for s in states)


def _id(value: Any, what: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"a {what} id is an integer, got {value!r}") from None
    if isinstance(value, bool) or not 0 < n < 2**63:
        raise ConfigError(f"a {what} id is a positive integer, got {value!r}")
    return n


def _sensitive_parameters(
    fn: Callable[..., Any], task: str, names: Sequence[str]
) -> dict[str, int | None]:
    """``@app.task(sensitive=)`` checked: each name -> its position among the
    positional parameters (None: keyword-only)."""
    if not names:
        return {}
    if isinstance(names, str):
        names = (names,)
    params = list(inspect.signature(fn).parameters.values())
    by_name = {p.name: p for p in params}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ConfigError(f"sensitive: {', '.join(unknown)} is not a parameter of {task}")
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {n: params.index(by_name[n]) if by_name[n].kind in positional else None for n in names}


def _check_retention(retention: Mapping[str, float | None]) -> dict[str, float | None]:
    """Seconds per finished state, each between 0 and 100 years, or None (forever)."""
    unknown = set(retention) - set(DEFAULT_RETENTION)
    if unknown:
        raise ConfigError(
            f"retention is per finished state {sorted(DEFAULT_RETENTION)}, got {sorted(unknown)}"
        )
    for state, keep in retention.items():
        if keep is not None and (
            isinstance(keep, bool)
            or not isinstance(keep, int | float)
            or not 0 <= keep <= MAX_RETENTION_S
        ):
            raise ConfigError(
                f"retention for {state!r} must be seconds from 0 to 100 years, "
                f"or None to keep forever; got {keep!r}"
            )
    return {JobState(k): v for k, v in retention.items()}


_paused_lock = threading.Lock()
_paused = False


@contextmanager
def _collection_paused() -> Iterator[None]:
    """No cyclic garbage collection while a bulk send runs: the thousands of
    handles and inserts it keeps alive are what set off collections, each of
    which walks them all again, and they form no cycles (a fifth of a 20,000-job
    send_many's CPU time). The send that paused the collector turns it back on
    when it ends; sends that start meanwhile (other threads: a server's bulk
    requests) run as they find it, so overlapping sends never keep it off past
    the first one's end. With the collector already off (the caller's choice),
    nothing changes."""
    global _paused
    with _paused_lock:
        mine = not _paused and gc.isenabled()
        if mine:
            _paused = True
            gc.disable()
    try:
        yield
    finally:
        if mine:
            with _paused_lock:
                _paused = False
                gc.enable()


class _Handles:
    """The handles of jobs this process just created, before their ids (``Job.unbound``),
    built without a read-back. Jobs sent together differ only in their arguments:
    one template serves a run of them."""

    def __init__(self, app: Conveyor, now: datetime) -> None:
        self.app, self.now = app, now
        self._shared: tuple[Any, ...] = ()
        self._template: dict[str, Any] = {}

    def unbound(self, ins: JobInsert, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Job:
        fields = ins.but_args()
        if fields != self._shared:
            self._shared, self._template = fields, _job_template(self.app, ins, self.now)
        return Job.unbound(self._template, list(args), dict(kwargs))


def _job_template(app: Conveyor, ins: JobInsert, now: datetime) -> dict[str, Any]:
    """The fields of the handles of jobs this process just created from inserts like
    ``ins``, built without a read-back (``Job.template``, ``Job.fresh``: send_many
    makes thousands)."""
    return Job.template(
        app,
        queue=ins.queue,
        task=ins.task,
        state=JobState.SCHEDULED if ins.delay_s > 0 else JobState.AVAILABLE,
        priority=ins.priority,
        attempts=0,
        max_attempts=ins.max_attempts,
        created_at=now,
        scheduled_at=now + timedelta(seconds=ins.delay_s) if ins.delay_s else now,
        timeout=ins.timeout_s,
        backoff=json.loads(ins.backoff_json) if ins.backoff_json else None,
        unique_key=ins.unique_key,
        idempotency_key=ins.idempotency_key,
        batch_id=ins.batch_id,
        tenant=ins.tenant,
        stage=ins.stage,
    )


__all__ = ["Conveyor", "JobRecord", "make_filter"]


def _serves(worker: WorkerInfo, queue: str, task: str | None) -> bool:
    """Whether ``worker`` takes jobs of this queue and task."""
    return queue in worker.queues and (worker.tasks is None or task in worker.tasks)
