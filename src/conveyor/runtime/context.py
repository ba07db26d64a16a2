"""What a running handler can ask about the job it is running."""

from __future__ import annotations

from contextvars import ContextVar

from ..job import Job

_current: ContextVar[Job | None] = ContextVar("conveyor_current_job", default=None)


def current_job() -> Job:
    """The job the calling handler is running (its id, attempt, stage, ...)."""
    job = _current.get()
    if job is None:
        raise RuntimeError("current_job() is only available inside a running Conveyor handler")
    return job
