"""The façade's operator actions on jobs: one job, or every job a filter
matches (in transactions of ``BULK_CHUNK`` rows), in this thread or as a job of
the built-in ``BULK_TASK`` with an audit record (``start_bulk``, ``run_bulk``)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from . import serialize
from .backends.interfaces import Backend
from .checks import check_id, make_filter
from .errors import ConfigError, JobNotFound, Permanent
from .job import Job
from .records import ActionRecord, BulkResult, Inserted, JobFilter, JobInsert, JobState
from .registry import BULK_TASK
from .runtime.context import current_job
from .task import Task

if TYPE_CHECKING:
    from .producing import Producer

log = logging.getLogger("conveyor")
#: rows a bulk action changes per transaction
BULK_CHUNK = 500


class BulkActionMissing(JobNotFound, Permanent):
    """A bulk action's job names an action with no record: it fails at once."""


class ActionsHost(Protocol):
    """What the actions call on the app (``Conveyor`` is one)."""

    @property
    def backend(self) -> Backend: ...

    @property
    def tasks(self) -> Mapping[str, Task[..., Any]]: ...

    def get_job(self, job_id: int) -> Job: ...

    def count_jobs(
        self, filter: JobFilter | None = None, *, cap: int | None = None, **fields: Any
    ) -> dict[str, int]: ...


class Actions:
    """Operator actions on the jobs of one app."""

    def __init__(self, host: ActionsHost, producer: Producer) -> None:
        self._host = host
        #: sends the job of a bulk action, as every job is sent (settings, hooks)
        self._producer = producer

    def retry_job(self, job_id: int) -> bool:
        f = JobFilter(ids=(check_id(job_id, "job"),))
        return bool(self._host.backend.job_retry_many(filter=f, limit=1))

    def cancel_job(self, job_id: int) -> str | None:
        f = JobFilter(ids=(check_id(job_id, "job"),))
        for _ in range(5):  # the job may move between the two checks: look again
            cancelled, requested = self._host.backend.job_cancel_many(filter=f, limit=1)
            if cancelled:
                return JobState.CANCELLED
            if requested:
                return "requested"
            job = self._host.get_job(job_id)
            if job.state.finished:
                return None
            if job.state == JobState.RUNNING and job.cancel_requested:
                return "requested"
        return None

    def delete_job(self, job_id: int) -> bool:
        self._host.get_job(job_id)  # a missing id is an error of its own
        f = JobFilter(ids=(check_id(job_id, "job"),))
        return bool(self._host.backend.job_delete_many(filter=f, limit=1))

    def retry_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
        **fields: Any,
    ) -> BulkResult:
        f = make_filter(filter, **fields)
        retryable = (JobState.FAILED, JobState.CANCELLED)
        matched = matching(self._host.count_jobs(f), retryable)
        if dry_run:
            return BulkResult("retry", f, matched, dry_run=True)
        done = 0
        while True:
            ids = self._host.backend.job_retry_many(filter=f, limit=BULK_CHUNK)
            done += len(ids)
            if progress:
                progress(done)
            if len(ids) < BULK_CHUNK:
                break
        return BulkResult("retry", f, matched, done)

    def cancel_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
        **fields: Any,
    ) -> BulkResult:
        f = make_filter(filter, **fields)
        active = (JobState.SCHEDULED, JobState.AVAILABLE, JobState.RUNNING)
        matched = matching(self._host.count_jobs(f), active)
        if dry_run:
            return BulkResult("cancel", f, matched, dry_run=True)
        done = requested = 0
        while True:
            cancelled, flagged = self._host.backend.job_cancel_many(filter=f, limit=BULK_CHUNK)
            done += len(cancelled)
            requested += len(flagged)
            if progress:
                progress(done + requested)
            if len(cancelled) + len(flagged) < BULK_CHUNK:
                break
        return BulkResult("cancel", f, matched, done, requested)

    def delete_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
        **fields: Any,
    ) -> BulkResult:
        f = make_filter(filter, **fields)
        deletable = tuple(s for s in JobState if s != JobState.RUNNING)
        matched = matching(self._host.count_jobs(f), deletable)
        if dry_run:
            return BulkResult("delete", f, matched, dry_run=True)
        done = 0
        while True:
            ids = self._host.backend.job_delete_many(filter=f, limit=BULK_CHUNK)
            done += len(ids)
            if progress:
                progress(done)
            if len(ids) < BULK_CHUNK:
                break
        return BulkResult("delete", f, matched, done)

    def start_bulk(
        self, action: str, filter: JobFilter, *, actor: str | None = None
    ) -> ActionRecord:
        """Record the action (state running) and the job of the built-in
        ``BULK_TASK`` that runs it (keyed by the action's id), in one transaction:
        a crash leaves both or neither, never a record that no job will finish."""
        run = self.bulk_method(action)
        matched = run(filter, dry_run=True).matched
        action_id = uuid.uuid4().hex[:16]
        described = serialize.job_filter(filter)
        job = self._host.tasks[BULK_TASK].build(
            (action_id,), {}, idempotency_key=f"{BULK_TASK}:{action_id}"
        )

        def write(jobs: Sequence[JobInsert]) -> list[Inserted]:
            return self._host.backend.action_insert(
                action_id=action_id,
                action=action,
                filter_json=json.dumps(described),
                actor=actor,
                matched=matched,
                jobs=jobs,
            )

        self._producer.insert_jobs([job], payloads=[((action_id,), {})], write=write)
        return self.bulk_action(action_id)

    def run_bulk(self, action_id: str) -> dict[str, Any]:
        """The handler of ``BULK_TASK``: run the recorded action, in chunks, its
        progress written to the record after each. Another attempt (after a crash)
        goes on where this one stopped: what was done no longer matches the filter,
        and ``done`` adds to what the record says. An action that ended is left be."""
        backend = self._host.backend
        record = backend.action_get(action_id=str(action_id))
        if record is None:
            raise BulkActionMissing(f"no bulk action with id {action_id}")
        if record.state != "running":
            return {"state": record.state, "done": record.done, "requested": record.requested}
        base_done, base_requested = record.done, record.requested

        def progress(done: int) -> None:
            backend.action_update(
                action_id=record.id,
                done=base_done + done,
                requested=base_requested,
                state="running",
            )

        try:
            f = serialize.job_filter_of(record.filter)
            result = self.bulk_method(record.action)(f, progress=progress)
        except Exception as exc:
            log.exception("bulk %s %s failed", record.action, record.id)
            if _last_attempt() or isinstance(exc, ConfigError):
                latest = backend.action_get(action_id=record.id) or record
                backend.action_update(
                    action_id=record.id,
                    done=latest.done,
                    requested=latest.requested,
                    state="failed",
                    error=str(exc),
                )
            raise
        done, requested = base_done + result.done, base_requested + result.requested
        backend.action_update(action_id=record.id, done=done, requested=requested, state="done")
        return {"state": "done", "done": done, "requested": requested}

    def bulk_method(self, action: str) -> Callable[..., BulkResult]:
        """``retry_jobs``, ``cancel_jobs`` or ``delete_jobs``, by the action's name."""
        methods = {"retry": self.retry_jobs, "cancel": self.cancel_jobs, "delete": self.delete_jobs}
        if action not in methods:
            raise ConfigError(f"unknown bulk action {action!r}; actions are: retry, cancel, delete")
        return methods[action]

    def bulk_action(self, action_id: str) -> ActionRecord:
        record = self._host.backend.action_get(action_id=str(action_id))
        if record is None:
            raise JobNotFound(f"no bulk action with id {action_id}")
        return record

    def bulk_actions(self, *, limit: int = 50) -> list[ActionRecord]:
        if not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise ConfigError(f"limit must be an integer from 1 to 1000, got {limit!r}")
        return self._host.backend.action_list(limit=limit)

    def prune(self, keep: Mapping[str, float | None], *, dry_run: bool) -> dict[str, int]:
        """Finished jobs older than ``keep[state]`` seconds go, 500 a transaction."""
        pruned: dict[str, int] = {}
        for state, keep_s in keep.items():
            if keep_s is None:
                continue
            total = 0
            while True:
                n = self._host.backend.job_prune(
                    state=state, older_than_s=keep_s, limit=500, dry_run=dry_run
                )
                total += n
                if dry_run or n < 500:
                    break
            pruned[str(state)] = total
            if total and not dry_run:
                log.info("pruned %d %s job(s) older than %gs", total, state, keep_s)
        return pruned


def _last_attempt() -> bool:
    """The running job has no attempt left after this one (outside a worker: yes)."""
    try:
        job = current_job()
    except RuntimeError:
        return True
    return job.attempts >= job.max_attempts


def matching(counts: Mapping[str, int], states: Iterable[str]) -> int:
    """How many of ``counts`` (per state) are in one of ``states``."""
    return sum(counts.get(str(s), 0) for s in states)
