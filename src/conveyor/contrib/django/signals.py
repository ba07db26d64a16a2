"""Django's ``task_finished`` signal, sent by the worker once a job's outcome is known."""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import close_old_connections
from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished

from conveyor import Attempt, JobRecord, Middleware

if TYPE_CHECKING:
    from conveyor.records import Finalize

log = logging.getLogger("conveyor.django")

#: a job's next state that ends it, as Django sees it
_FINISHED = {
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


class FinishedSignals(Middleware):
    """Sends ``task_finished`` for each Django task's job that succeeded, failed
    for good or was cancelled (an attempt followed by a retry leaves the task
    READY: no signal). The worker learns the outcome on its event loop, where
    Django's ORM may not be used: receivers run on a thread of their own, one
    job after another, with the thread's connections tidied as after a request."""

    def __init__(self, alias: str, sender: type, result_of: Callable[..., Any]) -> None:
        self.alias = alias
        self.sender = sender
        self._result_of = result_of
        self._queue: queue.SimpleQueue[tuple[JobRecord, Finalize, datetime]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def on_outcome(self, job: JobRecord, outcome: Finalize, duration_s: float | None) -> None:
        if outcome.state not in _FINISHED:
            return
        self._queue.put((job, outcome, datetime.now(UTC)))
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._send_all, name="conveyor-django-signals", daemon=True
                    )
                    self._thread.start()

    def _send_all(self) -> None:
        while True:
            job, outcome, when = self._queue.get()
            try:
                self._send(job, outcome, when)
            except Exception:
                log.exception("sending task_finished for job %d failed", job.id)
            finally:
                close_old_connections()

    def _send(self, job: JobRecord, outcome: Finalize, when: datetime) -> None:
        from django.tasks import task_backends

        backend = task_backends[self.alias]
        task = backend._task_of(job)
        if task is None:
            return  # not a Django task's job
        attempts = backend.app.job_attempts(job.id) if job.attempts > 1 else []
        # this attempt is not written yet: it is the outcome in hand
        this = Attempt(
            job_id=job.id,
            attempt=job.attempts,
            worker_id=job.lease_owner,
            started_at=job.started_at,
            finished_at=when,
            outcome=outcome.outcome,
            error=outcome.error,
            traceback=outcome.traceback,
        )
        attempts = [a for a in attempts if a.attempt != job.attempts or a.stage != job.stage]
        value = json.loads(outcome.result_json) if outcome.result_json else None
        status = _FINISHED[outcome.state]
        result = self._result_of(task, job, [*attempts, this], status, value, when)
        task_finished.send(self.sender, task_result=result)
