"""What an app registers: its tasks (``@app.task``) and their periodic
schedules (``@app.periodic``), checked before anything is recorded."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any, Protocol, cast

from .checks import check_name, sensitive_parameters
from .cron import Periodic
from .errors import ConfigError
from .retry import Backoff
from .task import Task, TaskApp, TaskDecorator, TaskDefaults

#: the built-in task whose jobs run the bulk actions the server starts
#: (``Actions.start_bulk``), and Conveyor's own queue, where its jobs wait (the
#: server runs a worker on it; ``conveyor worker --queues conveyor`` does too)
BULK_TASK = "conveyor.bulk_action"
INTERNAL_QUEUE = "conveyor"
#: the names of the tasks every app has
BUILTIN_TASKS = frozenset({BULK_TASK})


def user_tasks(tasks: Mapping[str, Task]) -> list[Task]:
    """The tasks the app's code registered: not Conveyor's built-in ones (whose
    queue a worker takes only when told to: ``--queues conveyor``)."""
    return [t for name, t in tasks.items() if name not in BUILTIN_TASKS]


class RegistryHost(Protocol):
    """What the registry calls on the app (``Conveyor`` is one)."""

    @property
    def plumbing(self) -> TaskApp:
        """What the tasks the registry makes are bound to."""
        ...

    @property
    def tasks(self) -> MutableMapping[str, Task]: ...

    @property
    def periodics(self) -> MutableMapping[str, Periodic]: ...

    @property
    def default_queue(self) -> str: ...

    def hide_arguments(self, task: str, parameters: Mapping[str, int | None]) -> None: ...


class Registry:
    """Registers the tasks and schedules of one app (in its ``tasks`` and
    ``periodics``), and stands in for tasks it has no handler for."""

    def __init__(self, host: RegistryHost) -> None:
        self._host = host
        self._remote: dict[str, Task] = {}

    def task(
        self,
        fn: Callable[..., Any] | None,
        name: str | None,
        sensitive: Sequence[str],
        *,
        queue: str | None,
        backoff: Backoff | dict[str, float] | None,
        retry_on: Sequence[type[BaseException]],
        pinned_to: Sequence[str] | str | None,
        **options: Any,
    ) -> Task | TaskDecorator:
        """What ``@app.task`` returns: ``fn`` as a task, or (without ``fn``) the
        decorator making one, with ``Conveyor.task``'s options as its defaults."""
        defaults = TaskDefaults(
            queue=queue or self._host.default_queue,
            backoff=Backoff.coerce(backoff) or Backoff(),
            retry_on=tuple(retry_on),
            pinned_to=(pinned_to,)
            if isinstance(pinned_to, str)
            else (tuple(pinned_to) if pinned_to is not None else None),
            **options,
        )

        def register(f: Callable[..., Any]) -> Task:
            return self.add(f, name, defaults, sensitive)

        # register is the decorator TaskDecorator describes (typed by the handler)
        return register(fn) if fn is not None else cast(TaskDecorator, register)

    def periodic(
        self,
        name: str | None,
        schedule: dict[str, Any],
        task_options: dict[str, Any],
        make_task: Callable[..., Callable[[Callable[..., Any]], Task]],
    ) -> Callable[[Callable[..., Any] | Task], Task]:
        """What ``@app.periodic`` returns: the decorator scheduling a task (or a
        function, made one by ``make_task`` with ``task_options``)."""
        # args are checked, and made a tuple, by Periodic
        kwargs = schedule["kwargs"]
        schedule = {**schedule, "kwargs": kwargs if kwargs is not None else {}}

        def register(f: Callable[..., Any] | Task) -> Task:
            return self.schedule(f, name, schedule, task_options, make_task)

        return register

    def add(
        self,
        f: Callable[..., Any],
        name: str | None,
        defaults: TaskDefaults,
        sensitive: Sequence[str],
    ) -> Task:
        """``f`` as a task named ``name`` (default: the function's)."""
        tasks = self._host.tasks
        task_name = name or getattr(f, "__name__", None)
        if not task_name:
            raise ConfigError(f"cannot name task {f!r}: pass name=")
        check_name(task_name, "a task name")
        if task_name in tasks:
            other = tasks[task_name].fn
            raise ConfigError(
                f"task name {task_name!r} is already registered by "
                f"{getattr(other, '__module__', '?')}.{getattr(other, '__qualname__', '?')}; "
                "pass name= to tell them apart"
            )
        hidden = sensitive_parameters(f, task_name, sensitive)
        t = Task(self._host.plumbing, f, task_name, defaults)
        tasks[task_name] = t
        if hidden:
            self._host.hide_arguments(task_name, hidden)
        return t

    def schedule(
        self,
        f: Callable[..., Any] | Task,
        name: str | None,
        schedule: Mapping[str, Any],
        task_options: dict[str, Any],
        make_task: Callable[..., Callable[[Callable[..., Any]], Task]],
    ) -> Task:
        """``f`` (a task of this app, or a function made one by ``make_task`` with
        ``task_options``) run on ``schedule`` (``Periodic``'s fields)."""
        if isinstance(f, Task):
            if f.app is not self._host.plumbing:
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
        # checks the schedule before anything is registered
        p = Periodic(task=task_name, name=name or task_name, **schedule)
        if p.name in self._host.periodics:
            raise ConfigError(
                f"a periodic named {p.name!r} is already registered; pass name= to "
                "tell the schedules apart"
            )
        t = f if isinstance(f, Task) else make_task(**task_options)(f)
        try:
            t.build(p.args, p.kwargs)  # arguments fit the handler and are JSON: fail now
        except Exception:
            if t is not f:
                del self._host.tasks[t.name]
            raise
        self._host.periodics[p.name] = dataclasses.replace(p, task=t)
        return t

    def add_builtin(self, plumbing: TaskApp, name: str, fn: Callable[..., Any], queue: str) -> Task:
        """A task of Conveyor's own (``conveyor.…``, on its own queue), registered
        on every app: bound to ``plumbing``, made before the app holds it."""
        task = Task(plumbing, fn, name, TaskDefaults(queue=queue, max_attempts=10))
        self._host.tasks[name] = task
        return task

    def task_for(self, name: str) -> Task:
        """The registered task ``name``, else a stand-in with default options."""
        task = self._host.tasks.get(name)
        if task is not None:
            return task
        if isinstance(name, Task):  # (typed as a name; said plainly at run time)
            raise ConfigError(
                f"enqueue by name takes the task's name, {name.name!r}, not the task:"
                f" or send through the task itself ({name.name.rsplit('.', 1)[-1]}.send(...))"
            )
        check_name(name, "a task name")
        remote = self._remote.get(name)
        if remote is None:
            remote = Task(
                self._host.plumbing, None, name, TaskDefaults(queue=self._host.default_queue)
            )
            self._remote[name] = remote
        return remote
