"""Which handler runs a job of task type X, and which task types a worker claims.

A worker claims only jobs it can run: with the default resolver, the tasks
registered on its app (two apps, or two versions of one app in a rolling
deploy, can share a queue without failing each other's jobs). An import-path
resolver runs any task named ``module:function``; a worker with no resolver
(``NoTasks``) claims nothing: a server that only stores and hands out jobs.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigError
from ..task import Task, TaskDefaults

if TYPE_CHECKING:
    from ..app import Conveyor


class TaskResolver(Protocol):
    def names(self) -> list[str] | None:
        """Task names this worker claims; ``None``: any."""

    def resolve(self, name: str) -> Task | None:
        """The task that runs jobs named ``name``, or ``None``."""


class RegisteredTasks:
    """The tasks registered on the app (the default)."""

    def __init__(self, app: Conveyor) -> None:
        self.app = app

    def names(self) -> list[str] | None:
        return sorted(self.app.tasks)

    def resolve(self, name: str) -> Task | None:
        return self.app.tasks.get(name)


class ImportPathTasks:
    """Tasks named ``package.module:function`` (registered tasks first): the
    function is imported on first use and run with default options."""

    def __init__(self, app: Conveyor) -> None:
        self.app = app
        self._found: dict[str, Task | None] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str] | None:
        return None

    def resolve(self, name: str) -> Task | None:
        task = self.app.tasks.get(name)
        if task is not None:
            return task
        with self._lock:
            if name not in self._found:
                self._found[name] = self._import(name)
            return self._found[name]

    def _import(self, name: str) -> Task | None:
        module_name, sep, attr = name.partition(":")
        if not sep:
            return None
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            return None
        if isinstance(obj, Task):
            return obj
        if not callable(obj):
            return None
        fn: Callable[..., Any] = obj
        return Task(self.app.plumbing, fn, name, TaskDefaults(queue=self.app.default_queue))


class NoTasks:
    """Runs nothing, claims nothing."""

    def names(self) -> list[str] | None:
        return []

    def resolve(self, name: str) -> Task | None:
        return None


def resolver_for(app: Conveyor, kind: str) -> TaskResolver:
    if kind == "registered":
        return RegisteredTasks(app)
    if kind == "import":
        return ImportPathTasks(app)
    if kind == "none":
        return NoTasks()
    raise ConfigError(f"unknown task resolver {kind!r}: use registered, import or none")
