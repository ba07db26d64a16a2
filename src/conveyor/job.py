"""Job records as the database holds them, and the handle users get back."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import Conveyor
    from .flow import Chain


class JobState(StrEnum):
    """scheduled -> available -> running -> succeeded | failed | cancelled.

    A retry goes from running back to scheduled, with a backoff time.
    The enum is a ``str``, so ``job.state == "succeeded"`` holds.
    """

    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in FINISHED_STATES


FINISHED_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES = frozenset({JobState.SCHEDULED, JobState.AVAILABLE, JobState.RUNNING})


@dataclass(frozen=True)
class Attempt:
    """One execution of a job, as recorded when it ended."""

    job_id: int
    attempt: int
    worker_id: str | None
    started_at: datetime | None
    finished_at: datetime
    outcome: str  # succeeded | retry | failed | lost | cancelled | stage
    error: str | None = None
    traceback: str | None = None
    stage: str | None = None

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


@dataclass(frozen=True)
class Job:
    """A job, fresh from the database at the moment it was read.

    ``app.get_job(job.id)`` (or ``job.refresh()``) reads it again.
    """

    id: int
    queue: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    state: JobState
    priority: int
    attempts: int
    max_attempts: int
    created_at: datetime
    scheduled_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    result: Any = None
    error: str | None = None
    stage: str | None = None
    timeout: float | None = None
    backoff: dict[str, float] | None = None
    unique_key: str | None = None
    idempotency_key: str | None = None
    lease_owner: str | None = None
    lease_token: str | None = None
    lease_expires_at: datetime | None = None
    #: the batch the job belongs to, if any
    batch_id: int | None = None
    #: data a multi-stage handler carries from one stage to the next (NextStage)
    context: Any = None
    #: chains: the first job of this job's chain, and the job run after this one
    #: (0 once a failed step ended the chain)
    chain_root: int | None = None
    chain_next: int | None = None
    #: steps still to run after this job, if it is part of a chain
    chain: list[dict[str, Any]] | None = None
    _app: Conveyor | None = field(default=None, repr=False, compare=False)

    def bind(self, app: Conveyor) -> Job:
        return replace(self, _app=app)

    def _require_app(self) -> Conveyor:
        if self._app is None:
            raise RuntimeError(
                "this Job record is not bound to a Conveyor app; use app.get_job(id)"
            )
        return self._app

    def refresh(self) -> Job:
        """The same job, read again from the database."""
        return self._require_app().get_job(self.id)

    def wait(self, timeout: float | None = None, poll: float = 0.05) -> Job:
        """Block until the job is finished (succeeded, failed or cancelled); return it.

        Raises ``TimeoutError`` if it is not finished within ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.refresh()
        while not job.state.finished:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} still {job.state} after {timeout}s")
            time.sleep(poll)
            poll = min(poll * 1.5, 1.0)
            job = self.refresh()
        return job

    def then(self, step: Any) -> Chain:
        """Run ``step`` (``task.s(...)`` or a task) after this job succeeds, with this
        job's result as its first argument. Returns the chain, to add more steps."""
        from .flow import Chain

        return Chain(self._require_app(), self.chain_root or self.id).then(step)

    def attempt_log(self) -> list[Attempt]:
        """Every recorded attempt, oldest first."""
        return self._require_app().backend.job_attempts(job_id=self.id)
