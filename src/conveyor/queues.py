"""The façade's control of queues: pause, a limit of running jobs, a rate,
each for a queue the app knows of (or forced, to set one up before it has jobs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .backends.interfaces import Backend
from .checks import check_name
from .errors import ConfigError
from .records import QueueInfo
from .registry import BUILTIN_TASKS, user_tasks
from .task import Task, parse_rate

MAX_INT32 = 2**31 - 1


class QueuesHost(Protocol):
    """What queue control reads of the app (``Conveyor`` is one)."""

    @property
    def backend(self) -> Backend: ...

    @property
    def tasks(self) -> Mapping[str, Task]: ...

    @property
    def default_queue(self) -> str: ...

    def queues(self) -> list[QueueInfo]: ...


class QueueControl:
    """Changes the queues of one app."""

    def __init__(self, host: QueuesHost) -> None:
        self._host = host

    def set_paused(self, name: str, paused: bool, force: bool) -> None:
        self._known(name, force)
        self._host.backend.queue_set_paused(name=name, paused=paused)

    def set_limit(self, name: str, max_running: int | None, force: bool) -> None:
        if max_running is not None and (
            not isinstance(max_running, int)
            or isinstance(max_running, bool)
            or not 0 <= max_running <= MAX_INT32
        ):
            raise ConfigError(
                f"max_running must be an integer from 0 to {MAX_INT32}, or None; "
                f"got {max_running!r}"
            )
        self._known(name, force)
        self._host.backend.queue_set_limit(name=name, max_running=max_running)

    def set_rate_limit(
        self, name: str, rate_limit: str | None, burst: float | None, force: bool
    ) -> None:
        rate = None if rate_limit is None else parse_rate(rate_limit)
        if burst is not None and (
            isinstance(burst, bool) or not isinstance(burst, int | float) or burst < 1
        ):
            raise ConfigError(f"burst must be a number >= 1, got {burst!r}")
        if rate is not None and burst is None:
            burst = max(1.0, rate)
        self._known(name, force)
        self._host.backend.queue_set_rate(
            name=name, rate_per_s=rate, rate_burst=None if rate is None else float(burst or 1)
        )

    def _known(self, name: str, force: bool) -> None:
        """A queue of one of the app's tasks, its default one, or one the database
        has: a typo would otherwise set up a queue no job ever goes to."""
        check_name(name, "a queue name")
        if force:
            return
        host = self._host
        builtin = {t.defaults.queue for n, t in host.tasks.items() if n in BUILTIN_TASKS}
        known = {t.defaults.queue for t in user_tasks(host.tasks)} | {host.default_queue}
        if name in known or name in builtin:
            return
        known |= {q.name for q in host.queues()} - builtin
        if name not in known:
            raise ConfigError(
                f"no queue named {name!r} (known: {', '.join(sorted(known))}); "
                "check the name, or pass force=True (--force) to set up a queue before "
                "it has jobs"
            )
