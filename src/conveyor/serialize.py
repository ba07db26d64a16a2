"""One JSON shape per record, for every client: the CLI's ``--json``, the HTTP
API, the event stream and the dashboard. Times are ISO 8601 in UTC; states
are their names; the lease token, a worker's proof of ownership, never leaves."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from .records import (
    Attempt,
    BatchRecord,
    BatchState,
    BulkResult,
    Change,
    JobRecord,
    JobState,
    QueueCount,
    QueueInfo,
    WorkerInfo,
)

#: fields never shown
HIDDEN_FIELDS = frozenset({"lease_token"})
_JOB_FIELDS = tuple(f.name for f in fields(JobRecord) if f.name not in HIDDEN_FIELDS)


def plain(value: Any) -> Any:
    """A JSON-ready copy: datetimes as ISO 8601 (with their offset; records are
    read in UTC), enums as their values."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    return value


def job(record: JobRecord, *, redact: Iterable[str] = ()) -> dict[str, Any]:
    """A job. ``redact``: keyword argument names whose values are hidden (a task's
    sensitive arguments)."""
    data = {name: plain(getattr(record, name)) for name in _JOB_FIELDS}
    hidden = set(redact)
    if hidden:
        data["kwargs"] = {k: ("***" if k in hidden else v) for k, v in data["kwargs"].items()}
    return data


def attempt(record: Attempt) -> dict[str, Any]:
    data = {f.name: plain(getattr(record, f.name)) for f in fields(record)}
    data["duration_s"] = record.duration_s
    return data


def batch(record: BatchRecord, progress: dict[str, Any] | None = None) -> dict[str, Any]:
    data = {f.name: plain(getattr(record, f.name)) for f in fields(record)}
    if progress is not None:
        data["progress"] = plain(progress)
    return data


def queue(info: QueueInfo) -> dict[str, Any]:
    return {f.name: plain(getattr(info, f.name)) for f in fields(info)}


def worker(info: WorkerInfo, *, now: datetime | None = None, ttl_s: float = 7.0) -> dict[str, Any]:
    """A worker, with how long ago it heartbeat and whether that makes it alive."""
    now = now or datetime.now(UTC)
    data = {f.name: plain(getattr(info, f.name)) for f in fields(info)}
    age = None if info.last_seen_at is None else (now - info.last_seen_at).total_seconds()
    data["heartbeat_age_s"] = None if age is None else round(age, 3)
    data["alive"] = age is not None and age <= ttl_s
    return data


def count(c: QueueCount) -> dict[str, Any]:
    return {"queue": c.queue, "task": c.task, "state": c.state, "count": c.count}


def bulk(result: BulkResult) -> dict[str, Any]:
    return {
        "action": result.action,
        "filter": {
            f.name: plain(getattr(result.filter, f.name))
            for f in fields(result.filter)
            if getattr(result.filter, f.name) is not None
        },
        "matched": result.matched,
        "done": result.done,
        "requested": result.requested,
        "dry_run": result.dry_run,
    }


#: what an event carries of a job (its arguments stay out: fetch the job for them)
_EVENT_FIELDS = (
    "id",
    "task",
    "queue",
    "state",
    "attempts",
    "max_attempts",
    "stage",
    "batch_id",
    "tenant",
    "priority",
    "error",
    "result",
    "created_at",
    "scheduled_at",
    "started_at",
    "finished_at",
)


def job_event_name(record: JobRecord) -> str:
    """created, started, succeeded, failed, cancelled, or retried (back in the queue
    after an attempt)."""
    if record.state == JobState.RUNNING:
        return "started"
    if record.state.finished:
        return str(record.state)
    return "retried" if record.attempts or record.error else "created"


def change(c: Change) -> dict[str, Any]:
    """An event: ``{"id", "event", "data"}`` (SSE's id, event and data fields)."""
    if c.job is not None:
        data = {name: plain(getattr(c.job, name)) for name in _EVENT_FIELDS}
        return {"id": str(c.cursor), "event": f"job.{job_event_name(c.job)}", "data": data}
    assert c.batch is not None
    name = "batch.closed" if c.batch.state != BatchState.RUNNING else "batch.opened"
    return {"id": str(c.cursor), "event": name, "data": batch(c.batch)}


def progress_event(cursor: str, batch_id: int, progress: dict[str, Any]) -> dict[str, Any]:
    data = {"batch_id": batch_id, **plain(progress)}
    return {"id": cursor, "event": "batch.progress", "data": data}
