"""Batches: one call creates N independent jobs; the aggregator closes the batch."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from . import serialize
from .errors import KeyReused
from .job import Job
from .records import (
    FINISHED_STATES,
    WAITING_STATES,
    BatchRecord,
    BatchState,
    JobInsert,
    JobState,
)


class BatchApp(Protocol):
    """What a Batch calls on the app that read it (``Conveyor`` is one)."""

    def get_batch(self, batch_id: int) -> Batch: ...

    def batch_progress(self, batch_id: int) -> dict[str, int]: ...

    def batch_jobs(self, batch_id: int) -> list[Job]: ...

    def batch_finished_jobs(
        self, batch_id: int, *, after: tuple[datetime, int] | None = None, limit: int = 500
    ) -> list[Job]: ...

    def cancel_batch(self, batch_id: int) -> int: ...

    def retry_batch_failed(self, batch_id: int) -> int: ...

    def change_generation(self) -> int: ...

    def wait_for_change(self, generation: int, timeout: float) -> None: ...


@dataclass(frozen=True)
class Batch:
    """A batch as read from the database. Progress comes from the per-batch counts
    the database keeps; the batch row itself only changes when the aggregator
    closes it."""

    record: BatchRecord
    created: bool = True  # False when an idempotency key returned an existing batch
    _app: BatchApp | None = field(default=None, repr=False, compare=False)

    # -- what it is -------------------------------------------------------------------
    @property
    def id(self) -> int:
        return self.record.id

    @property
    def name(self) -> str | None:
        return self.record.name

    @property
    def state(self) -> BatchState:
        """running | succeeded | completed_with_failures | cancelled | callback_failed"""
        return self.record.state

    @property
    def total(self) -> int:
        return self.record.total

    @property
    def finished(self) -> bool:
        return self.record.state != BatchState.RUNNING

    @property
    def counts(self) -> dict[str, int] | None:
        """Final counts per job state, written when the batch closed."""
        return self.record.counts

    @property
    def app(self) -> BatchApp:
        if self._app is None:
            raise RuntimeError("this Batch is not bound to an app; use app.get_batch(id)")
        return self._app

    def refresh(self) -> Batch:
        return self.app.get_batch(self.id)

    # -- where it stands ------------------------------------------------------------------
    def progress(self, *, refresh: bool = True) -> dict[str, Any]:
        """``{"total", the counts of the finished states and JobState.RUNNING, "pending",
        "percent", "eta_s", "state"}``, from the per-batch counts the database keeps.
        ``refresh=False``: the state this handle was read with (a list just read),
        instead of the batch's state read again."""
        counts = self.app.batch_progress(self.id)
        done = sum(counts.get(s, 0) for s in FINISHED_STATES)
        total = self.total
        elapsed = (datetime.now(UTC) - self.record.created_at).total_seconds()
        eta: float | None = None
        if done >= total:
            eta = 0
        elif done and elapsed > 0:
            eta = math.ceil((total - done) / (done / elapsed))
        # (plain strings: printed, it reads as JSON does; a JobState still finds them)
        return {
            "total": total,
            "succeeded": counts.get(JobState.SUCCEEDED, 0),
            "failed": counts.get(JobState.FAILED, 0),
            "cancelled": counts.get(JobState.CANCELLED, 0),
            "running": counts.get(JobState.RUNNING, 0),
            "pending": sum(counts.get(s, 0) for s in WAITING_STATES),
            "percent": 100 if total == 0 else math.floor(done * 100 / total),
            "eta_s": eta,
            "state": str(self.refresh().state if refresh else self.state),
        }

    def as_completed(self, timeout: float | None = None) -> Iterator[Job]:
        """Each job of the batch as it finishes (succeeded, failed or cancelled),
        before the batch as a whole is done; ends when every job has been seen.

        Finish times come from concurrent transactions that may commit out of
        order, so each poll looks back a little and skips jobs already seen."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seen: set[int] = set()
        cursor: tuple[datetime, int] | None = None
        lookback = timedelta(seconds=2)
        while len(seen) < self.total:
            generation = self.app.change_generation()
            after = (cursor[0] - lookback, 0) if cursor else None
            fresh = 0
            while True:
                page = self.app.batch_finished_jobs(self.id, after=after, limit=1000)
                for job in page:
                    if job.id not in seen:
                        seen.add(job.id)
                        fresh += 1
                        yield job
                if len(page) < 1000:
                    break
                after = (page[-1].finished_at or datetime.now(UTC), page[-1].id)
            if page:
                cursor = (page[-1].finished_at or datetime.now(UTC), page[-1].id)
            if len(seen) >= self.total:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"batch {self.id}: {len(seen)} of {self.total} jobs finished after {timeout}s"
                )
            if not fresh:
                self.app.wait_for_change(generation, 1.0)

    def wait(self, timeout: float | None = None) -> Batch:
        """Block until the aggregator has closed the batch; return it fresh."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            generation = self.app.change_generation()
            batch = self.refresh()
            if batch.finished:
                return batch
            remaining = 3600.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"batch {self.id} still running after {timeout}s")
            self.app.wait_for_change(generation, remaining)

    def jobs(self) -> list[Job]:
        """Every job of the batch, in the order of the items."""
        return self.app.batch_jobs(self.id)

    def results(self) -> list[Any]:
        """Each item's result in item order (``None`` for a job that did not succeed)."""
        return [j.result if j.state == JobState.SUCCEEDED else None for j in self.jobs()]

    # -- operator actions ------------------------------------------------------------------
    def cancel(self) -> int:
        """Cancel the jobs not started yet (running ones finish); the batch then
        closes as cancelled and its callback does not run. Returns jobs cancelled."""
        return self.app.cancel_batch(self.id)

    def retry_failed(self) -> int:
        """Give each failed job one more attempt and reopen the batch; its callback
        runs again when it closes again. Returns jobs retried."""
        return self.app.retry_batch_failed(self.id)


def batch_fingerprint(task: str, asked: Mapping[str, Any], inserts: Sequence[JobInsert]) -> str:
    """What a batch call asked for, as a hash: the task, ``asked`` (its name,
    callback and send options as given) and every item's encoded arguments, in
    order. The options as given, not the job template they make: a ``run_at``
    becomes a delay from now, different on every call. Arguments the task
    declared sensitive are left out: a repeat never tells whether a guessed
    value matched."""
    head = json.dumps({"task": task, **asked}, sort_keys=True, default=str, separators=(",", ":"))
    digest = hashlib.sha256(head.encode("utf-8", "surrogatepass"))
    hides = serialize.hides_arguments(task)
    for insert in inserts:
        digest.update(b"\n")
        text = insert.args_json
        if hides:
            doc = serialize.hidden_document(task, text)
            text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        digest.update(text.encode("utf-8", "surrogatepass"))
    return "sha256:" + digest.hexdigest()


def check_same_batch(batch: Batch, fingerprint: str, task: str, total: int) -> None:
    """``KeyReused`` unless the batch an idempotency key named was asked for by
    this same call (a retry), over HTTP or from Python: a key names one batch.
    One created without a fingerprint (before schema v21) is compared on its
    task and size, all it kept of the request."""
    record = batch.record
    if record.fingerprint is not None:
        same = record.fingerprint == fingerprint
    else:
        same = (record.task, record.total) == (task, total)
    if not same:
        made = f"batch {record.id}, task {record.task!r}, {record.total} items"
        raise KeyReused(record.idempotency_key or "", made)
