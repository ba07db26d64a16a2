"""Conveyor's job records as Django's ``TaskResult`` fields."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from datetime import datetime

from django.conf import settings
from django.tasks import TaskResultStatus
from django.tasks.base import TaskError
from django.utils import timezone

from conveyor import Attempt, JobRecord, JobState, Outcome

#: Django has four statuses: a job waiting (or waiting for its retry) is READY,
#: a cancelled one FAILED
STATUS = {
    JobState.SCHEDULED: TaskResultStatus.READY,
    JobState.AVAILABLE: TaskResultStatus.READY,
    JobState.RUNNING: TaskResultStatus.RUNNING,
    JobState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobState.FAILED: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
}
#: attempts that gave the job back without running it to an end
_NOT_RUN = frozenset({Outcome.RELEASED})


def to_django_time(value: datetime | None) -> datetime | None:
    """Aware UTC as Django hands times out: aware, or naive local with USE_TZ off."""
    if value is None or settings.USE_TZ:
        return value
    return timezone.make_naive(value, timezone.get_default_timezone())


def worker_ids_of(job: JobRecord, attempts: Sequence[Attempt]) -> list[str]:
    """The worker of each attempt, oldest first; a running job's current worker last."""
    ids = [a.worker_id or "" for a in attempts if a.outcome not in _NOT_RUN]
    running = job.state == JobState.RUNNING and job.lease_owner
    if running and len(ids) < job.attempts:
        ids.append(str(job.lease_owner))
    return ids


def errors_of(attempts: Sequence[Attempt]) -> list[TaskError]:
    """One ``TaskError`` per attempt that ended in an error, oldest first."""
    return [
        TaskError(
            exception_class_path=exception_path(a.error or "", a.traceback),
            traceback=a.traceback or a.error or "",
        )
        for a in attempts
        if a.error is not None and a.outcome not in _NOT_RUN
    ]


def exception_path(error: str, traceback: str | None) -> str:
    """The exception's import path, as Django's ``TaskError`` wants it.

    Conveyor records ``"Name: message"`` and the formatted traceback, whose own
    line for the exception names its module (``myapp.tasks.Flaky: ...``; built-in
    exceptions stand alone, ``ValueError: ...``). Found there, else from the name."""
    name = error.split(":", 1)[0].strip() or "Exception"
    for line in reversed((traceback or "").splitlines()):
        if not line or line[0].isspace():
            continue
        head = line.split(":", 1)[0].strip()
        if head == name or head.endswith("." + name):
            return head if "." in head else _bare(head)
    return _bare(name)


def _bare(name: str) -> str:
    """A name the traceback gave without a module: a built-in's, else ``__main__``'s."""
    if isinstance(getattr(builtins, name, None), type):
        return f"builtins.{name}"
    return f"__main__.{name}" if name.isidentifier() else "builtins.Exception"
