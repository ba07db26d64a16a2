"""The façade producers, workers, the CLI and the HTTP API all go through."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, overload

from .backends import open_backend
from .backends.base import Backend, JobInsert, QueueCount, QueueInfo
from .batch import Batch
from .cron import Periodic
from .errors import ConfigError, JobNotFound, SchemaError
from .flow import Chain, Step, start_chain
from .job import Job, JobState
from .retry import Backoff
from .task import Task, TaskDefaults

DEFAULT_URL = "sqlite:///conveyor.db"
DAY = 86400.0
DEFAULT_RETENTION: dict[str, float | None] = {
    "succeeded": 7 * DAY,
    "failed": 30 * DAY,
    "cancelled": 7 * DAY,
}


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
    ) -> None:
        self.url = url or os.environ.get("CONVEYOR_DATABASE_URL") or DEFAULT_URL
        self.default_queue = default_queue
        self.auto_migrate = auto_migrate
        self.max_payload_bytes = max_payload_bytes
        #: a waiting job gains one priority point per priority_aging_s seconds, up to
        #: priority_max_boost points, so urgent traffic cannot starve it forever
        self.priority_aging_s = priority_aging_s
        self.priority_max_boost = priority_max_boost
        #: seconds finished jobs are kept, per state; None keeps them forever
        self.retention = {**DEFAULT_RETENTION, **_check_retention(retention or {})}
        if priority_aging_s is not None and priority_aging_s <= 0:
            raise ConfigError(f"priority_aging_s must be > 0 or None, got {priority_aging_s}")
        self.tasks: dict[str, Task] = {}
        #: periodic (cron) schedules by name; every worker enqueues their ticks
        self.periodics: dict[str, Periodic] = {}
        self._backend: Backend | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<Conveyor {self.url} tasks={sorted(self.tasks)}>"

    # -- database --------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
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

    def _prepare(self, backend: Backend) -> None:
        if self.auto_migrate:
            backend.migrate()  # also refuses a schema newer than this code
            return
        version = backend.schema_version()
        if version == 0:
            raise SchemaError(f"no Conveyor schema in {self.url}: run `conveyor migrate` first")
        if version > backend.latest_schema:
            raise SchemaError(
                f"{self.url} has schema version {version}, but this Conveyor only knows up to "
                f"version {backend.latest_schema}: upgrade the conveyor package"
            )

    def migrate(self) -> list[int]:
        """Apply pending migrations (refusing a newer schema); return the versions applied."""
        with self._lock:
            if self._backend is not None:
                return self._backend.migrate()
            backend = open_backend(self.url)
            try:
                applied = backend.migrate()
            except BaseException:
                backend.close()
                raise
            self._backend = backend
            return applied

    def close(self) -> None:
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
        concurrency_key: str | Callable[..., str] | None = None,
        concurrency_limit: int | None = None,
        rate_limit: str | None = None,
        rate_burst: float | None = None,
        rate_key: str | Callable[..., str] | None = None,
        pinned_to: Sequence[str] | str | None = None,
    ) -> Callable[[Callable[..., Any]], Task]: ...

    def task(
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
        concurrency_key: str | Callable[..., str] | None = None,
        concurrency_limit: int | None = None,
        rate_limit: str | None = None,
        rate_burst: float | None = None,
        rate_key: str | Callable[..., str] | None = None,
        pinned_to: Sequence[str] | str | None = None,
    ) -> Task | Callable[[Callable[..., Any]], Task]:
        """Register a handler (sync or async) as a task. ``@app.task`` or ``@app.task(...)``.

        ``retry_on``: exceptions that are retried; any other exception, or
        ``conveyor.Permanent``, fails the job at once.
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
        """
        defaults = TaskDefaults(
            queue=queue or self.default_queue,
            priority=priority,
            max_attempts=max_attempts,
            timeout=timeout,
            backoff=Backoff.coerce(backoff) or Backoff(),
            retry_on=tuple(retry_on),
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            rate_limit=rate_limit,
            rate_burst=rate_burst,
            rate_key=rate_key,
            pinned_to=(pinned_to,)
            if isinstance(pinned_to, str)
            else (tuple(pinned_to) if pinned_to is not None else None),
        )

        def register(f: Callable[..., Any]) -> Task:
            task_name = name or getattr(f, "__name__", None)
            if not task_name:
                raise ConfigError(f"cannot name task {f!r}: pass name=")
            if task_name in self.tasks:
                other = self.tasks[task_name].fn
                raise ConfigError(
                    f"task name {task_name!r} is already registered by "
                    f"{other.__module__}.{other.__qualname__}; pass name= to tell them apart"
                )
            t = Task(self, f, task_name, defaults)
            self.tasks[task_name] = t
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

    # -- producing -------------------------------------------------------------------
    def insert_jobs(
        self,
        inserts: Sequence[JobInsert],
        *,
        conn: Any = None,
        payloads: Sequence[tuple[Sequence[Any], Mapping[str, Any]]] | None = None,
    ) -> list[Job]:
        """Write prepared jobs; returns handles in input order. ``payloads`` are the
        (args, kwargs) the inserts were encoded from, reused for the handles. Jobs
        whose key named an existing job come back as that job, read fresh."""
        now = datetime.now(UTC)
        results = self.backend.job_insert_many(jobs=inserts, conn=conn)
        jobs = []
        for n, (ins, res) in enumerate(zip(inserts, results, strict=True)):
            existing = None if res.created else self.backend.job_get(job_id=res.id)
            if existing is not None:
                jobs.append(existing.bind(self))
                continue
            if payloads is not None:
                args, kwargs = payloads[n]
            else:
                decoded = json.loads(ins.args_json)
                args, kwargs = decoded["args"], decoded["kwargs"]
            jobs.append(_local_job(self, res.id, ins, list(args), dict(kwargs), now))
        return jobs

    def enqueue(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """Enqueue by task name (the CLI and HTTP API use this)."""
        t = self.tasks.get(task)
        if t is None:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise ConfigError(f"unknown task {task!r}; tasks registered on this app: {known}")
        conn = options.pop("conn", None)
        return self.insert_jobs([t.build(args, kwargs or {}, **options)], conn=conn)[0]

    # -- inspecting and operating -------------------------------------------------------
    def get_job(self, job_id: int) -> Job:
        job = self.backend.job_get(job_id=int(job_id))
        if job is None:
            raise JobNotFound(f"no job with id {job_id}")
        return job.bind(self)

    def list_jobs(
        self,
        *,
        queue: str | None = None,
        state: str | None = None,
        task: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
    ) -> list[Job]:
        if state is not None:
            try:
                state = JobState(state).value
            except ValueError:
                names = ", ".join(s.value for s in JobState)
                raise ConfigError(f"unknown job state {state!r}; states are: {names}") from None
        jobs = self.backend.job_list(
            queue=queue, state=state, task=task, limit=limit, before_id=before_id
        )
        return [j.bind(self) for j in jobs]

    def get_batch(self, batch_id: int) -> Batch:
        record = self.backend.batch_get(batch_id=int(batch_id))
        if record is None:
            raise JobNotFound(f"no batch with id {batch_id}")
        return Batch(record, True, self)

    def list_batches(
        self, *, state: str | None = None, limit: int = 50, before_id: int | None = None
    ) -> list[Batch]:
        records = self.backend.batch_list(state=state, limit=limit, before_id=before_id)
        return [Batch(r, True, self) for r in records]

    def chain(self, *steps: Step | Task, conn: Any = None) -> Chain:
        """Run steps one after another, each receiving the previous result."""
        return start_chain(self, steps, conn=conn)

    def get_chain(self, chain_id: int) -> Chain:
        return Chain(self, int(chain_id))

    def retry_job(self, job_id: int) -> bool:
        return self.backend.job_retry(job_id=int(job_id))

    def cancel_job(self, job_id: int) -> str | None:
        """Cancel a job wherever it is: ``"cancelled"`` if it had not started,
        ``"requested"`` if it is running (its worker cancels it at its next
        heartbeat), ``None`` if it had already finished."""
        for _ in range(5):  # the job may move between the two checks: look again
            if self.backend.job_cancel(job_id=int(job_id)):
                return "cancelled"
            if self.backend.job_request_cancel(job_id=int(job_id)):
                return "requested"
            if self.get_job(job_id).state.finished:
                return None
        return None

    def set_queue_limit(self, name: str, max_running: int | None) -> None:
        """At most ``max_running`` jobs of queue ``name`` run at once across every
        worker (``None`` removes the limit). Workers apply a change within a second."""
        _check_queue_name(name)
        if max_running is not None and (
            not isinstance(max_running, int)
            or isinstance(max_running, bool)
            or not 0 <= max_running <= MAX_INT32
        ):
            raise ConfigError(
                f"max_running must be an integer from 0 to {MAX_INT32}, or None; "
                f"got {max_running!r}"
            )
        self.backend.queue_set_limit(name=name, max_running=max_running)

    def set_queue_rate_limit(
        self, name: str, rate_limit: str | None, burst: float | None = None
    ) -> None:
        """A token bucket for the whole queue, e.g. ``"100/m"``, shared by every
        worker; ``burst`` tokens at most (default one second's worth, at least 1).
        ``None`` removes it. Workers apply a change within a second."""
        from .task import parse_rate

        _check_queue_name(name)
        rate = None if rate_limit is None else parse_rate(rate_limit)
        if burst is not None and (
            isinstance(burst, bool) or not isinstance(burst, int | float) or burst < 1
        ):
            raise ConfigError(f"burst must be a number >= 1, got {burst!r}")
        if rate is not None and burst is None:
            burst = max(1.0, rate)
        self.backend.queue_set_rate(
            name=name, rate_per_s=rate, rate_burst=None if rate is None else float(burst or 1)
        )

    def pause_queue(self, name: str) -> None:
        """No worker claims from a paused queue; running jobs finish."""
        _check_queue_name(name)
        self.backend.queue_set_paused(name=name, paused=True)

    def resume_queue(self, name: str) -> None:
        _check_queue_name(name)
        self.backend.queue_set_paused(name=name, paused=False)

    def queues(self) -> list[QueueInfo]:
        return self.backend.queue_list()

    def stop_worker(self, worker_id: str) -> bool:
        """Ask a worker to drain and exit; it learns at its next heartbeat."""
        return self.backend.worker_request_stop(worker_id=worker_id)

    def prune(
        self, *, dry_run: bool = False, retention: dict[str, float | None] | None = None
    ) -> dict[str, int]:
        """Apply retention now: finished jobs older than their state's retention go,
        in small batches. ``dry_run`` only counts them."""
        from .runtime.services import Maintenance

        keep = {**self.retention, **_check_retention(retention or {})}
        return Maintenance(self.backend, retention=keep).prune(dry_run=dry_run)

    def counts(self) -> list[QueueCount]:
        return self.backend.queue_counts()


MAX_INT32 = 2**31 - 1
MAX_RETENTION_S = 100 * 365 * DAY


def _check_queue_name(name: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"a queue name is a non-empty string, got {name!r}")


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
    return dict(retention)


def _local_job(
    app: Conveyor,
    job_id: int,
    ins: JobInsert,
    args: list[Any],
    kwargs: dict[str, Any],
    now: datetime,
) -> Job:
    """The handle of a job this process just created, built without a read-back."""
    return Job(
        id=job_id,
        queue=ins.queue,
        task=ins.task,
        args=args,
        kwargs=kwargs,
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
        _app=app,
    )
