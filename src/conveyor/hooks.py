"""Hooks: how cross-cutting concerns (metrics, traces, logs, signals, your own
code) plug into enqueue and execution without touching the worker.

Subclass :class:`Middleware`, override what you need (every method has a
do-nothing default) and register it: ``Conveyor(url, middleware=[Mine()])`` or
``app.add_middleware(Mine())``. Middlewares run in the order registered;
``execute`` wraps like onion layers, the first registered outermost.

Error classification is a hook too: a task's ``classify=`` function, then each
middleware's ``classify``, may decide what an exception means for the job
(:class:`Retry` with its own delay or attempt budget, :class:`Fail`, or
:class:`~conveyor.Snooze`); ``None`` leaves it to the next, and finally to the
default rule (``Permanent`` or an exception outside ``retry_on`` fails the job,
anything else is retried with the task's backoff).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .records import Finalize, JobInsert, JobRecord


@dataclass(frozen=True)
class Retry:
    """Retry the job: after ``delay`` seconds (default: the task's backoff), and
    allowing up to ``max_attempts`` attempts in all (default: the job's own)."""

    delay: float | None = None
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.delay is not None and (not isinstance(self.delay, int | float) or self.delay < 0):
            raise ConfigError(f"Retry delay must be a number of seconds >= 0, got {self.delay!r}")
        if self.max_attempts is not None and (
            not isinstance(self.max_attempts, int) or self.max_attempts < 1
        ):
            raise ConfigError(
                f"Retry max_attempts must be an integer >= 1, got {self.max_attempts!r}"
            )


@dataclass(frozen=True)
class Fail:
    """Fail the job now, without retrying; ``reason`` is added to the error."""

    reason: str | None = None


CallNext = Callable[[], Awaitable[Any]]


class Middleware:
    """Base class of hooks; override any method."""

    # -- producers ------------------------------------------------------------------
    def on_enqueue(self, jobs: list[JobInsert]) -> list[JobInsert]:
        """Before jobs are written: return them, changed if you like (say, with trace
        context in their ``context_json``). Runs in the producer."""
        return jobs

    def on_enqueued(self, jobs: Sequence[Any]) -> None:
        """After jobs are written (``conveyor.Job`` handles). With ``conn=`` they are
        not committed yet: the caller's transaction may still roll back."""

    # -- workers ----------------------------------------------------------------------
    async def execute(self, job: JobRecord, call_next: CallNext) -> Any:
        """Around the handler: ``return await call_next()`` runs it (and the
        middlewares inside this one) and gives its result; exceptions come through.
        Runs in the worker's event loop, also for sync handlers (then the handler
        runs in a thread, with the context variables set here)."""
        return await call_next()

    def classify(self, job: JobRecord, exc: BaseException) -> Retry | Fail | Any | None:
        """What ``exc`` means for ``job``: ``Retry(...)``, ``Fail(...)``,
        ``Snooze(seconds)``, or ``None`` to leave it to the next classifier."""
        return None

    def on_outcome(self, job: JobRecord, outcome: Finalize, duration_s: float | None) -> None:
        """An attempt ended (before the outcome is written). ``duration_s`` is the
        handler's run time (``None`` if it never started)."""

    def on_written(self, outcome: Finalize, accepted: bool) -> None:
        """The outcome was written (``accepted``) or refused by fencing."""

    def on_claimed(self, jobs: Sequence[JobRecord], duration_s: float) -> None:
        """A worker's claim statement took ``jobs`` (maybe none) in ``duration_s``."""

    def on_flushed(self, outcomes: Sequence[Finalize], duration_s: float) -> None:
        """A worker wrote a batch of outcomes in ``duration_s``."""


def check_middleware(middleware: object) -> Middleware:
    """``Conveyor(middleware=)``, ``add_middleware``: a ``Middleware``."""
    if not isinstance(middleware, Middleware):
        raise ConfigError(
            f"middleware must subclass conveyor.Middleware, got {type(middleware).__name__}"
        )
    return middleware


def run_enqueue_hooks(middleware: Sequence[Middleware], jobs: list[JobInsert]) -> list[JobInsert]:
    for m in middleware:
        jobs = m.on_enqueue(jobs)
    return jobs


def chain_execute(middleware: Sequence[Middleware], job: JobRecord, handler: CallNext) -> CallNext:
    """The handler wrapped by every middleware's ``execute``, first outermost."""
    call = handler
    for m in reversed(middleware):
        if type(m).execute is Middleware.execute:
            continue  # not overridden: no layer, no cost
        call = _layer(m, job, call)
    return call


def _layer(m: Middleware, job: JobRecord, inner: CallNext) -> CallNext:
    def call() -> Awaitable[Any]:
        return m.execute(job, inner)

    return call
