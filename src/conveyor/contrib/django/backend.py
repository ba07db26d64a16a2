"""The task backend: Django's ``Task``/``TaskResult`` on top of Conveyor's jobs.

A Django task is a Conveyor task named by its module path
(``myapp.tasks.send_email``), registered on the backend's app when the task is
defined; a job's id is the ``TaskResult`` id. An enqueue writes the job through
Django's connection, inside ``transaction.atomic``: in the caller's transaction
if there is one (the job exists only if it commits), else in its own.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.core import checks
from django.db import close_old_connections, connections, transaction
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_started
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from conveyor import (
    Attempt,
    Backoff,
    ConfigError,
    Conveyor,
    JobNotFound,
    JobRecord,
    current_job,
)
from conveyor import Task as ConveyorHandler
from conveyor.task import SEND_OPTIONS

from . import database
from .results import STATUS, errors_of, to_django_time, worker_ids_of
from .signals import FinishedSignals

#: the OPTIONS a backend reads
OPTION_KEYS = ("DATABASE", "URL", "PERIODIC", "CONVEYOR")
#: ConveyorTask fields that are options of Conveyor's ``app.task``
TASK_OPTIONS = (
    "max_attempts",
    "timeout",
    "backoff",
    "retry_on",
    "classify",
    "concurrency_key",
    "concurrency_limit",
    "rate_limit",
    "rate_burst",
    "rate_key",
    "pinned_to",
    "tenant_key",
    "sensitive",
)
#: ConveyorTask fields sent with each job (a value, or a function of the arguments)
SEND_FIELDS = ("unique_key", "idempotency_key")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConveyorTask(Task):
    """Django's ``Task`` with Conveyor's options: ``@task(max_attempts=3, timeout=60,
    concurrency_key="user_id", concurrency_limit=1)`` (Django 6.1 passes the
    decorator's keywords here). ``queue`` is another name for ``queue_name``.

    The options of ``Conveyor.task`` apply to every job of the task;
    ``unique_key`` and ``idempotency_key`` to each job: a string, or a function
    of the task's arguments returning one (``unique_key=lambda user_id: f"u{user_id}"``),
    and ``.using(unique_key=...)`` sets them for one enqueue."""

    queue: str | None = None
    max_attempts: int | None = None
    timeout: float | None = None
    backoff: Backoff | Mapping[str, float] | None = None
    retry_on: Sequence[type[BaseException]] | None = None
    classify: Callable[..., Any] | None = None
    concurrency_key: str | Callable[..., str] | None = None
    concurrency_limit: int | None = None
    rate_limit: str | None = None
    rate_burst: float | None = None
    rate_key: str | Callable[..., str] | None = None
    pinned_to: Sequence[str] | str | None = None
    tenant_key: str | Callable[..., str] | None = None
    sensitive: Sequence[str] = ()
    unique_key: str | Callable[..., str] | None = None
    idempotency_key: str | Callable[..., str] | None = None

    def __post_init__(self) -> None:
        if self.queue is not None:
            # once: a copy made by using(queue_name=...) must keep its own queue
            object.__setattr__(self, "queue_name", self.queue)
            object.__setattr__(self, "queue", None)
        Task.__post_init__(self)  # the backend's validate_task

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        **options: Any,
    ) -> ConveyorTask:
        """Django's ``using``, plus ``unique_key=`` and ``idempotency_key=`` for one
        enqueue."""
        unknown = set(options) - set(SEND_FIELDS)
        if unknown:
            raise TypeError(
                f"using() got unknown option(s) {sorted(unknown)}; Conveyor adds "
                f"{', '.join(SEND_FIELDS)} to Django's priority, queue_name, run_after, backend"
            )
        task: ConveyorTask = Task.using(
            self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
        )
        return dataclasses.replace(task, **options) if options else task

    def conveyor_options(self) -> dict[str, Any]:
        """The options of Conveyor's ``app.task`` this task sets."""
        options = {name: getattr(self, name) for name in TASK_OPTIONS}
        return {k: v for k, v in options.items() if v is not None and v != ()}


class ConveyorBackend(BaseTaskBackend):
    """Django's tasks on Conveyor. ``TASKS = {"default": {"BACKEND":
    "conveyor.contrib.django.ConveyorBackend"}}`` keeps the jobs in Django's
    ``default`` database; ``OPTIONS``:

    - ``"DATABASE"``: another alias of ``DATABASES``;
    - ``"URL"``: a Conveyor database URL of its own (an enqueue then commits at
      once, whatever Django's transaction does);
    - ``"PERIODIC"``: ``{name: {"task": "app.tasks.fn", "cron": "0 * * * *", ...}}``,
      schedules run by the workers (the other keys are ``Conveyor.periodic``'s);
    - ``"CONVEYOR"``: keyword arguments of ``Conveyor(...)`` (``max_payload_bytes``,
      ``retention``, ...).
    """

    task_class = ConveyorTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        self.database: str | None = (
            None if "URL" in self.options else self.options.get("DATABASE", "default")
        )
        if self.database is not None:
            database.open_with(self.database, alias)

    # -- the app --------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self.database is None:
            return str(self.options["URL"])
        return database.url_for(self.database)

    @property
    def app(self) -> Conveyor:
        """The process's Conveyor app of this backend (its tasks registered on it)."""
        return database.app_for(self.alias, self.url, self._make_app)

    def _make_app(self, url: str) -> Conveyor:
        options = dict(self.options.get("CONVEYOR") or {})
        # `manage.py migrate` creates the tables: a web process never migrates
        options.setdefault("auto_migrate", False)
        app = Conveyor(url, **options)
        app.add_middleware(FinishedSignals(self.alias, type(self), self._result_of))
        return app

    # -- tasks ----------------------------------------------------------------------
    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        try:
            self.register(task)
        except ConfigError as exc:
            raise InvalidTask(str(exc)) from exc

    def register(self, task: Task) -> ConveyorHandler:
        """The Conveyor task that runs ``task``'s jobs. A task is registered when it
        is defined; a copy (``using()``) finds it there, and a declaration of the
        same function with other options replaces it."""
        app = self.app
        name = task.module_path
        options = task.conveyor_options() if isinstance(task, ConveyorTask) else {}
        options["queue"] = task.queue_name
        existing = app.tasks.get(name)
        if existing is not None:
            fn = existing.fn
            same = getattr(fn, "django_func", None) is task.func
            if same and getattr(fn, "options", None) == options:
                return existing
            del app.tasks[name]
        try:
            return app.task(name=name, **options)(_handler(task, self, options))
        except BaseException:
            if existing is not None:
                app.tasks[name] = existing
            raise

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskResult:
        self.validate_task(task)
        options = self._send_options(task, args, kwargs)
        app = self.app
        if self.database is None:
            job = app.enqueue(task.module_path, list(args), dict(kwargs), **options)
        else:
            # A savepoint inside the caller's transaction, or a transaction of its own:
            # the job commits with the caller's work, through the caller's connection.
            with transaction.atomic(using=self.database):
                conn = connections[self.database].connection
                job = app.enqueue(task.module_path, list(args), dict(kwargs), conn=conn, **options)
        result = self._result(task, job, [])
        task_enqueued.send(type(self), task_result=result)
        return result

    def _send_options(
        self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        options: dict[str, Any] = {"priority": task.priority, "queue": task.queue_name}
        if task.run_after is not None:
            run_at = task.run_after
            if timezone.is_naive(run_at):  # USE_TZ = False: Django's local time
                run_at = timezone.make_aware(run_at, timezone.get_default_timezone())
            options["run_at"] = run_at
        if isinstance(task, ConveyorTask):
            for name in SEND_FIELDS:
                value = getattr(task, name)
                if callable(value):
                    value = value(*args, **kwargs)
                if value is not None:
                    options[name] = value
        return options

    # -- results --------------------------------------------------------------------
    def get_result(self, result_id: str) -> TaskResult:
        try:
            job_id = int(result_id)
            job = self.app.get_job(job_id)
        except (ValueError, TypeError, ConfigError, JobNotFound):
            raise TaskResultDoesNotExist(result_id) from None
        task = self._task_of(job)
        if task is None:
            raise TaskResultDoesNotExist(result_id)
        attempts = self.app.job_attempts(job.id) if job.attempts else []
        return self._result(task, job, attempts)

    def _task_of(self, job: JobRecord) -> Task | None:
        """The Django task of a job, as the job was sent (priority, queue); ``None``
        for a job that is not a Django task's."""
        registered = self.app.tasks.get(job.task)
        task = getattr(registered.fn, "django_task", None) if registered else None
        if task is None:
            try:
                task = import_string(job.task)
            except ImportError:
                return None
        if not isinstance(task, Task):
            return None
        priority = job.base_priority if job.base_priority is not None else job.priority
        if (priority, job.queue) == (task.priority, task.queue_name):
            return task
        try:
            return task.using(priority=priority, queue_name=job.queue)
        except InvalidTask:  # its queue or priority is no longer one Django allows
            return task

    def _result(self, task: Task, job: JobRecord, attempts: Sequence[Attempt]) -> TaskResult:
        return self._result_of(task, job, attempts, STATUS[job.state], job.result)

    def _result_of(
        self,
        task: Task,
        job: JobRecord,
        attempts: Sequence[Attempt],
        status: TaskResultStatus,
        value: Any,
        finished_at: datetime | None = None,
    ) -> TaskResult:
        first = next((a.started_at for a in attempts if a.started_at is not None), None)
        result = TaskResult(
            task=task,
            id=str(job.id),
            status=status,
            enqueued_at=to_django_time(job.created_at),
            started_at=to_django_time(first or job.started_at),
            finished_at=to_django_time(finished_at or job.finished_at),
            last_attempted_at=to_django_time(job.started_at),
            args=list(job.args),
            kwargs=dict(job.kwargs),
            backend=self.alias,
            errors=errors_of(attempts),
            worker_ids=worker_ids_of(job, attempts),
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", value)
        return result

    # -- checks ---------------------------------------------------------------------
    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        from .checks import backend_messages

        yield from super().check(**kwargs)
        yield from backend_messages(self)


def _handler(
    task: Task, backend: ConveyorBackend, options: Mapping[str, Any]
) -> Callable[..., Any]:
    """What Conveyor's worker calls for a job of ``task``: the Django function
    (given a ``TaskContext`` if it takes one), between Django's ``task_started``
    signal and a tidy-up of the thread's database connections (as Django does
    around a request). ``task_finished`` is sent once the outcome is known
    (``FinishedSignals``)."""
    func = task.func
    sender = type(backend)

    def started() -> TaskResult:
        job = current_job()
        attempts = backend.app.job_attempts(job.id) if job.attempts > 1 else []
        return backend._result_of(task, job, attempts, TaskResultStatus.RUNNING, None)

    def call(result: TaskResult, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        if task.takes_context:
            return func(TaskContext(task_result=result), *args, **kwargs)
        return func(*args, **kwargs)

    run: Callable[..., Any]
    if inspect.iscoroutinefunction(func):

        async def run(*args: Any, **kwargs: Any) -> Any:
            result = started()
            await task_started.asend(sender, task_result=result)
            return normalize_json(await call(result, args, kwargs))

    else:

        def run(*args: Any, **kwargs: Any) -> Any:
            close_old_connections()
            try:
                result = started()
                task_started.send(sender, task_result=result)
                return normalize_json(call(result, args, kwargs))
            finally:
                close_old_connections()

    handler: Any = run  # a function with attributes of ours
    signature = inspect.signature(func)
    parameters = list(signature.parameters.values())[1 if task.takes_context else 0 :]
    if not SEND_OPTIONS & {p.name for p in parameters}:
        # the task's own parameters: Conveyor checks a call's arguments at enqueue
        # and finds the parameters a concurrency_key or tenant_key names
        handler.__signature__ = signature.replace(parameters=parameters)
    handler.__name__ = func.__name__
    handler.__qualname__ = func.__qualname__
    handler.__module__ = func.__module__
    handler.__doc__ = func.__doc__
    handler.django_func = func
    handler.django_task = task
    handler.options = dict(options)
    return handler


def periodic(cron: str, *, backend: str = "default", **options: Any) -> Callable[[Task], Task]:
    """Run a Django task on a cron schedule, through Conveyor's cron (every worker
    of the backend's database enqueues each tick once)::

        @periodic("*/15 * * * *", timezone="Europe/Paris")
        @task
        def refresh_rates() -> None: ...

    ``options`` are ``Conveyor.periodic``'s (``args``, ``kwargs``, ``name``,
    ``missed``, ``catch_up``, ``grace_s``, ``timezone``)."""

    def register(task: Task) -> Task:
        if not isinstance(task, Task):
            raise InvalidTask(
                f"@periodic goes above @task (it schedules a Django task), got {task!r}"
            )
        from django.tasks import task_backends

        target = task_backends[backend]
        if not isinstance(target, ConveyorBackend):
            raise InvalidTask(f"task backend {backend!r} is not a ConveyorBackend")
        handler = target.register(task)
        existing = target.app.periodics.get(options.get("name") or handler.name)
        if existing is not None and existing.task is handler:
            return task  # the module was imported again
        try:
            target.app.periodic(cron, **options)(handler)
        except ConfigError as exc:
            raise InvalidTask(str(exc)) from exc
        return task

    return register
