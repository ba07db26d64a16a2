"""The façade's reads of jobs, batches and workers: ids checked, the records
turned into handles bound to the app, sensitive arguments known before a job
is shown. Lists and counts come from the replica when there is one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from .backends.interfaces import Backend
from .batch import Batch
from .checks import check_id, make_filter
from .errors import ConfigError, JobNotFound
from .job import Job
from .records import BatchState, JobFilter, JobRecord, WorkerInfo
from .task import TaskApp


class ReadsHost(Protocol):
    """What the reads call on the app (``Conveyor`` is one)."""

    @property
    def plumbing(self) -> TaskApp:
        """What the handles the reads return are bound to."""
        ...

    @property
    def backend(self) -> Backend: ...

    @property
    def reads(self) -> Backend: ...

    def workers(self) -> list[WorkerInfo]: ...


class Reads:
    """Reads the jobs, batches and workers of one app."""

    def __init__(
        self, host: ReadsHost, before_shown: Callable[[Sequence[JobRecord]], None]
    ) -> None:
        self._host = host
        #: ``Serving.before_shown``: the sensitive declarations jobs may fall under
        self._before_shown = before_shown

    def _jobs(self, records: Sequence[JobRecord]) -> list[Job]:
        self._before_shown(records)
        return [Job.of(r, self._host.plumbing) for r in records]

    def get_job(self, job_id: int) -> Job:
        record = self._host.backend.job_get(job_id=check_id(job_id, "job"))
        if record is None:
            raise JobNotFound(f"no job with id {job_id}")
        return self._jobs([record])[0]

    def list_jobs(
        self,
        filter: JobFilter | None,
        limit: int,
        before_id: int | None,
        primary: bool,
        **fields: Any,
    ) -> list[Job]:
        f = make_filter(filter, **fields)
        if not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise ConfigError(f"limit must be an integer from 1 to 10000, got {limit!r}")
        source = self._host.backend if primary else self._host.reads
        return self._jobs(source.job_list(filter=f, limit=limit, before_id=before_id))

    def get_batch(self, batch_id: int) -> Batch:
        record = self._host.backend.batch_get(batch_id=check_id(batch_id, "batch"))
        if record is None:
            raise JobNotFound(f"no batch with id {batch_id}")
        return Batch(record, True, self._host.plumbing)

    def list_batches(self, state: str | None, limit: int, before_id: int | None) -> list[Batch]:
        if state is not None:
            try:
                BatchState(state)
            except ValueError:
                names = ", ".join(s.value for s in BatchState)
                raise ConfigError(f"unknown batch state {state!r}; states are: {names}") from None
        records = self._host.reads.batch_list(state=state, limit=limit, before_id=before_id)
        return [Batch(r, True, self._host.plumbing) for r in records]

    def batch_jobs(self, batch_id: int) -> list[Job]:
        records = self._host.backend.batch_jobs(batch_id=check_id(batch_id, "batch"))
        return [Job.of(r, self._host.plumbing) for r in records]

    def batch_finished_jobs(
        self, batch_id: int, after: tuple[datetime, int] | None, limit: int
    ) -> list[Job]:
        batch = check_id(batch_id, "batch")
        return self._jobs(
            self._host.backend.batch_finished_jobs(batch_id=batch, after=after, limit=limit)
        )

    def get_worker(self, worker_id: str) -> WorkerInfo:
        found = next((w for w in self._host.workers() if w.id == worker_id), None)
        if found is None:
            raise JobNotFound(f"no worker with id {worker_id!r}")
        return found
