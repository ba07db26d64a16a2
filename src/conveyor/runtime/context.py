"""What a running handler can ask about the job it is running."""

from __future__ import annotations

from contextvars import ContextVar

from ..durable import JobContext
from ..records import JobRecord

_current: ContextVar[JobRecord | None] = ContextVar("conveyor_current_job", default=None)


class CancelFlag:
    """Set once someone asks to cancel a running job; read from any thread. One per
    running job, so a plain attribute rather than a ``threading.Event`` (whose lock
    and condition cost more than the rest of a no-op job's bookkeeping): nothing
    waits on it, handlers and the executor only look."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


_cancel: ContextVar[CancelFlag | None] = ContextVar("conveyor_cancel", default=None)


def current_job() -> JobContext:
    """The job the calling handler is running: its fields (id, attempts, stage,
    context, ...), as the ``JobRecord`` it is, and its durable steps (``step``,
    ``sleep``, ``wait_for_event``: see conveyor/durable.py)."""
    job = _current.get()
    if job is None:
        raise RuntimeError("current_job() is only available inside a running Conveyor handler")
    if type(job) is not JobContext:
        # Made on first ask, then kept for the rest of this run of the handler (the
        # handler's own context: the executor resets it when the run ends), so the
        # steps it read once are read once per run.
        job = JobContext.of(job)
        _current.set(job)
    return job


def cancel_requested() -> bool:
    """True once someone asked to cancel the job this handler is running. Async
    handlers are cancelled for you; a long sync handler should check this and
    return early (the job ends ``cancelled`` either way)."""
    event = _cancel.get()
    return event is not None and event.is_set()
