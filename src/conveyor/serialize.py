"""One JSON shape per record, for every client: the CLI's ``--json``, the HTTP
API, the event stream and the dashboard. Times are ISO 8601 in UTC; states
are their names; the lease token, a worker's proof of ownership, never leaves,
except in ``lease()``: the answer to the worker that holds it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import fields
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from .records import (
    ActionRecord,
    ApiToken,
    Attempt,
    BatchRecord,
    BatchState,
    BulkResult,
    Change,
    JobFilter,
    JobRecord,
    JobState,
    QueueCount,
    QueueInfo,
    TaskSettings,
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


#: task name -> (its parameters in order, the ones to hide): ``@app.task(sensitive=)``
_SENSITIVE: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {}
HIDDEN = "***"


def hide_arguments(task: str, parameters: Iterable[str], names: Iterable[str]) -> None:
    """From now on, every view of a job of ``task`` hides these arguments."""
    _SENSITIVE[task] = (tuple(parameters), frozenset(names))


def job(record: JobRecord, *, redact: Iterable[str] = ()) -> dict[str, Any]:
    """A job. Arguments its task declared ``sensitive`` (and ``redact``: more
    names) are shown as ``***``, by keyword or by position."""
    data = {name: plain(getattr(record, name)) for name in _JOB_FIELDS}
    order, hidden = _SENSITIVE.get(record.task, ((), frozenset()))
    hidden = hidden | set(redact)
    if hidden:
        data["kwargs"] = {k: (HIDDEN if k in hidden else v) for k, v in data["kwargs"].items()}
        if isinstance(data["args"], list):
            data["args"] = [
                HIDDEN if i < len(order) and order[i] in hidden else v
                for i, v in enumerate(data["args"])
            ]
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


def job_filter(f: JobFilter) -> dict[str, Any]:
    """The fields a filter sets."""
    return {x.name: plain(getattr(f, x.name)) for x in fields(f) if getattr(f, x.name) is not None}


def action(record: ActionRecord) -> dict[str, Any]:
    """A bulk action run in the background, as its audit record says."""
    return {f.name: plain(getattr(record, f.name)) for f in fields(record)}


def bulk(result: BulkResult) -> dict[str, Any]:
    return {
        "action": result.action,
        "filter": job_filter(result.filter),
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


def lease(record: JobRecord) -> dict[str, Any]:
    """A job as handed to the remote worker that just claimed it: the only shape
    that carries the lease token (its proof of ownership, sent with every outcome)."""
    data = job(record)
    data["token"] = record.lease_token
    # W3C trace context of the code that sent the job: a remote worker's span
    # continues it (``headers`` has it too; this is the one field to look at)
    data["traceparent"] = (record.headers or {}).get("traceparent")
    return data


def task_settings(s: TaskSettings) -> dict[str, Any]:
    return {f.name: plain(getattr(s, f.name)) for f in fields(s)}


def token(t: ApiToken) -> dict[str, Any]:
    """A token's id, name and scope: never its secret (which is not stored)."""
    data = {f.name: plain(getattr(t, f.name)) for f in fields(t)}
    data["active"] = t.active
    return data


def outcome(result: Any) -> dict[str, Any]:
    """An ``outcomes.OutcomeResult``."""
    return {f.name: plain(getattr(result, f.name)) for f in fields(result)}


# -- asyncflow (seed 001) compatibility: its field names and numeric statuses -------------------
#: asyncflow statuses: 1 waiting, 2 running, 3 succeeded, 4 failed (cancelled too)
ASYNCFLOW_STATUS = {
    JobState.SCHEDULED: 1,
    JobState.AVAILABLE: 1,
    JobState.RUNNING: 2,
    JobState.SUCCEEDED: 3,
    JobState.FAILED: 4,
    JobState.CANCELLED: 4,
}
#: runs kept in scheduleLog's history, as the seed describes
ASYNCFLOW_HISTORY = 5


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _ms(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def _schedule_data(a: Attempt) -> dict[str, Any]:
    cost = a.duration_s
    return {
        "TraceId": "-".join(str(p) for p in (a.job_id, a.stage, a.attempt) if p is not None),
        "ErrMsg": a.error or "",
        "Cost": "" if cost is None else f"{round(cost * 1000)}ms",
    }


def asyncflow_task(
    record: JobRecord, attempts: Iterable[Attempt] = (), *, retry_cap_s: float = 0.0
) -> dict[str, Any]:
    """A job as asyncflow's ``taskData``. ``scheduleLog`` is derived from the attempt
    log: the last run and the last five (trace id ``<job>-<stage>-<attempt>``, error,
    cost);
    a cancelled job says so there. ``taskContext`` is the context as a JSON string.
    ``retry_cap_s``: the task's backoff cap, for a job without a backoff of its own."""
    runs = [_schedule_data(a) for a in attempts]
    log: dict[str, Any] = {
        "LastData": runs[-1] if runs else {},
        "HistoryDatas": runs[-ASYNCFLOW_HISTORY:],
    }
    if record.state == JobState.CANCELLED:
        log["LastData"] = {**log["LastData"], "ErrMsg": record.error or "cancelled"}
    backoff = record.backoff or {}
    return {
        "userId": record.tenant or "",
        "taskId": str(record.id),
        "taskType": record.task,
        "taskStage": record.stage or "",
        "status": ASYNCFLOW_STATUS[record.state],
        "crtRetryNum": record.attempts,
        "maxRetryNum": record.max_attempts,
        "maxRetryInterval": backoff.get("cap", retry_cap_s),
        "priority": record.priority,
        "orderTime": _ms(record.scheduled_at),
        "scheduleLog": _compact(log),
        "taskContext": "" if record.context is None else _compact(record.context),
        "createTime": _ms(record.created_at),
        "modifyTime": _ms(record.finished_at or record.started_at or record.created_at),
    }


def asyncflow_settings(s: TaskSettings) -> dict[str, Any]:
    """A task type's settings as an asyncflow ``t_schedule_cfg`` row."""
    return {
        "task_type": s.task,
        "schedule_limit": s.batch_size,
        "schedule_interval": s.poll_interval_s,
        "max_processing_time": s.max_processing_s,
        "max_retry_num": s.max_attempts,
        "retry_interval": s.retry_interval_s,
        "max_retry_interval": s.retry_cap_s,
        "create_time": None,
        "modify_time": _ms(s.updated_at),
    }
