"""One JSON shape per record, for every client: the CLI's ``--json``, the HTTP
API, the event stream and the dashboard. Times are ISO 8601 in UTC; states
are their names; the lease token, a worker's proof of ownership, never leaves,
except in ``lease()``: the answer to the worker that holds it. Where the CLI
printed other names for a few fields before, its shapes (``cli_*``) keep them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import fields
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from .encoding import FINGERPRINT_HEADER
from .errors import ConfigError
from .records import (
    STATE_ORDER,
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
    WorkflowNode,
    WorkflowRecord,
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


#: task name -> (positions, names) of the arguments to hide: ``@app.task(sensitive=)``
#: of this process, and those the database records (``Conveyor`` adds them: a
#: server without the app hides them too). Only ever added to: two apps' tasks
#: of one name both hide what either declares.
_SENSITIVE: dict[str, tuple[frozenset[int], frozenset[str]]] = {}
#: task name -> each sensitive parameter's name -> its position(s), to name them
_DECLARED: dict[str, dict[str, frozenset[int | None]]] = {}
HIDDEN = "***"


def hide_arguments(task: str, parameters: Mapping[str, int | None]) -> None:
    """From now on, every view of a job of ``task`` hides these arguments: name ->
    its position among the positional parameters (None: passed by keyword only)."""
    positions, names = _SENSITIVE.get(task, (frozenset(), frozenset()))
    more = {p for p in parameters.values() if p is not None}
    _SENSITIVE[task] = (positions | more, names | set(parameters))
    declared = _DECLARED.setdefault(task, {})
    for name, position in parameters.items():
        declared[name] = declared.get(name, frozenset()) | {position}


def sensitive_parameters(task: str) -> tuple[frozenset[int], dict[str, frozenset[int | None]]]:
    """What ``job`` hides of ``task``'s jobs: the positions, and each parameter by
    name with its position(s) (None: by keyword only)."""
    positions, _ = _SENSITIVE.get(task, (frozenset(), frozenset()))
    return positions, dict(_DECLARED.get(task, {}))


def job(record: JobRecord, *, redact: Iterable[str] = ()) -> dict[str, Any]:
    """A job. Arguments its task declared ``sensitive`` are shown as ``***``, by
    keyword or by position (and ``redact``: more keywords)."""
    data = {name: plain(getattr(record, name)) for name in _JOB_FIELDS}
    if FINGERPRINT_HEADER in data["headers"]:
        data["headers"] = {k: v for k, v in data["headers"].items() if k != FINGERPRINT_HEADER}
    data["args"], data["kwargs"] = hidden_arguments(
        record.task, data["args"], data["kwargs"], redact
    )
    return data


def hides_arguments(task: str) -> bool:
    """Whether jobs of ``task`` have arguments to hide (``hidden_arguments``)."""
    return task in _SENSITIVE


def hidden_document(task: str, args_json: str) -> dict[str, Any]:
    """An encoded arguments document (``{"args", "kwargs", ...}``), decoded, with
    ``hidden_arguments`` applied: what a fingerprint of a call may cover."""
    doc: dict[str, Any] = json.loads(args_json)
    doc["args"], doc["kwargs"] = hidden_arguments(task, doc.get("args"), doc.get("kwargs"))
    return doc


def hidden_arguments(
    task: str, args: Any, kwargs: Any, redact: Iterable[str] = ()
) -> tuple[Any, Any]:
    """A call's arguments as they may be shown: those its task declared
    ``sensitive`` (and ``redact``: more keywords) replaced by ``***``."""
    positions, hidden = _SENSITIVE.get(task, (frozenset(), frozenset()))
    hidden = hidden | set(redact)
    if hidden and isinstance(kwargs, dict):
        kwargs = {k: (HIDDEN if k in hidden else v) for k, v in kwargs.items()}
    if positions and isinstance(args, list):
        args = [HIDDEN if i in positions else v for i, v in enumerate(args)]
    return args, kwargs


def attempt(record: Attempt) -> dict[str, Any]:
    data = {f.name: plain(getattr(record, f.name)) for f in fields(record)}
    data["duration_s"] = record.duration_s
    return data


def batch(record: BatchRecord, progress: dict[str, Any] | None = None) -> dict[str, Any]:
    """A batch. ``on_complete`` is the name of the task it calls when it closes, as
    ``POST /v1/batches`` takes it (and the CLI shows it), not the job template
    kept to enqueue that call. Its request fingerprint stays inside, as a job's does."""
    data = {
        f.name: plain(getattr(record, f.name)) for f in fields(record) if f.name != "fingerprint"
    }
    data["on_complete"] = (record.on_complete or {}).get("task")
    if progress is not None:
        data["progress"] = plain(progress)
    return data


def workflow(record: WorkflowRecord) -> dict[str, Any]:
    """A workflow run. Its request fingerprint stays inside, as a batch's does."""
    return {
        f.name: plain(getattr(record, f.name)) for f in fields(record) if f.name != "fingerprint"
    }


def workflow_node(
    node: WorkflowNode, item_counts: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """A node of a workflow (or, ``item`` >= 0, an item of a map node), with its
    result decoded, as a job's is shown (``result_json`` stays inside). A map
    node with items made also carries ``item_counts``: its items per state."""
    data = {f.name: plain(getattr(node, f.name)) for f in fields(node) if f.name != "result_json"}
    try:
        data["result"] = node.result
    except ValueError:  # stored by another version, unreadable here: say so, not a 500
        data["result"] = None
        data["unreadable"] = True
    if item_counts is not None:
        data["item_counts"] = dict(item_counts)
    return data


def queue(info: QueueInfo) -> dict[str, Any]:
    return {f.name: plain(getattr(info, f.name)) for f in fields(info)}


def worker(info: WorkerInfo, *, now: datetime | None = None, ttl_s: float = 7.0) -> dict[str, Any]:
    """A worker, with how long ago it heartbeat and whether that makes it alive."""
    data = {f.name: plain(getattr(info, f.name)) for f in fields(info)}
    age = _heard_from(info, now)
    data["heartbeat_age_s"] = None if age is None else round(age, 3)
    data["alive"] = age is not None and age <= ttl_s
    return data


def _heard_from(info: WorkerInfo, now: datetime | None) -> float | None:
    """Seconds since the worker's last heartbeat (None: it never sent one)."""
    if info.last_seen_at is None:
        return None
    return ((now or datetime.now(UTC)) - info.last_seen_at).total_seconds()


def count(c: QueueCount) -> dict[str, Any]:
    return {"queue": c.queue, "task": c.task, "state": c.state, "count": c.count}


def job_filter(f: JobFilter) -> dict[str, Any]:
    """The fields a filter sets."""
    return {x.name: plain(getattr(f, x.name)) for x in fields(f) if getattr(f, x.name) is not None}


#: a filter's fields that are times
_TIMES = ("created_after", "created_before", "finished_after", "finished_before", "due_before")


def job_filter_of(described: Mapping[str, Any]) -> JobFilter:
    """The filter ``job_filter`` described (a bulk action's stored one): its times
    from ISO 8601 text, the rest as ``JobFilter`` takes them."""
    names = {x.name for x in fields(JobFilter)}
    unknown = sorted(set(described) - names)
    if unknown:
        raise ConfigError(f"unknown job filter field(s) {unknown}; fields are: {sorted(names)}")
    values = dict(described)
    for name in _TIMES:
        values[name] = _when(values.get(name), name)
    return JobFilter(**values)


def _when(value: Any, name: str) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        raise ConfigError(f"{name} must be an ISO 8601 time, got {value!r}") from None


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
    "unreadable",
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
    that carries the lease token (its proof of ownership, sent with every outcome),
    and the values of sensitive arguments."""
    data = job(record)
    # its holder runs it: the arguments as sent, sensitive ones too
    data["args"], data["kwargs"] = plain(record.args), plain(record.kwargs)
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


# -- the CLI's --json: the shapes above under the names the CLI printed first --------------------
def cli_worker(
    info: WorkerInfo, *, silent_after_s: float, now: datetime | None = None
) -> dict[str, Any]:
    """A worker with what the CLI says of its heartbeat: ``last_seen_s_ago`` (never
    negative) and ``silent`` (heard from, but not for over ``silent_after_s``: most
    likely gone without deregistering), instead of the server's ``alive``, which
    is judged by the server's worker ttl."""
    data = {f.name: plain(getattr(info, f.name)) for f in fields(info)}
    age = _heard_from(info, now)
    data["last_seen_s_ago"] = None if age is None else max(0.0, age)
    data["silent"] = age is not None and age > silent_after_s
    return data


def state_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """A count for every job state, in the order a job goes through them (0 for a
    state with none: a database counts only the states it holds)."""
    out = dict.fromkeys((s.value for s in STATE_ORDER), 0)
    for name, n in counts.items():
        out[name] = out.get(name, 0) + int(n)
    return out


def cli_queue(info: QueueInfo) -> dict[str, Any]:
    """A queue as ``conveyor queues list --json`` shows it: its name, whether it is
    paused, its limit on running jobs, its rate limit (jobs a second and burst, or
    None), and a count for every state."""
    return {
        "name": info.name,
        "paused": bool(info.paused),
        "max_running": info.max_running,
        "rate_per_s": info.rate_per_s,
        "rate_burst": info.rate_burst,
        "counts": state_counts(info.counts),
    }


def cli_batch(record: BatchRecord, progress: dict[str, Any]) -> dict[str, Any]:
    """``batch()`` as the CLI names it: the progress's ``state`` as the batch's
    (``progress()`` reads it after the counts: the fresher of the two), and
    ``final_counts`` for the counts a closed batch keeps."""
    data = batch(record, progress)
    data["state"] = plain(progress["state"])
    data["final_counts"] = data.pop("counts")
    data["progress"] = {k: v for k, v in data["progress"].items() if k != "state"}
    return data


def batch_brief(record: BatchRecord, progress: dict[str, Any]) -> dict[str, Any]:
    """A batch in a line of ``conveyor status``: its id, name and task, and its progress."""
    return {"id": record.id, "name": record.name, "task": record.task, **plain(progress)}


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


def _whole(value: float | None) -> float | int | None:
    """Seconds as flowsvr shows them, an integer (Conveyor keeps floats); a
    fraction stays, rather than be rounded away."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


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
    ``taskType`` is in lower case, as flowsvr stores a type (its routes match a
    type whatever its case). ``retry_cap_s``: the task's backoff cap, for a job
    without a backoff of its own."""
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
        "taskType": record.task.lower(),
        "taskStage": record.stage or "",
        "status": ASYNCFLOW_STATUS[record.state],
        "crtRetryNum": record.attempts,
        "maxRetryNum": record.max_attempts,
        "maxRetryInterval": _whole(backoff.get("cap", retry_cap_s)),
        "priority": record.priority,
        "orderTime": _ms(record.scheduled_at),
        "scheduleLog": _compact(log),
        "taskContext": "" if record.context is None else _compact(record.context),
        "createTime": _ms(record.created_at),
        "modifyTime": _ms(record.finished_at or record.started_at or record.created_at),
    }


def asyncflow_settings(s: TaskSettings) -> dict[str, Any]:
    """A task type's settings as an asyncflow ``t_schedule_cfg`` row (its name as
    it was configured, like the row's; seconds as integers)."""
    return {
        "task_type": s.task,
        "schedule_limit": s.batch_size,
        "schedule_interval": _whole(s.poll_interval_s),
        "max_processing_time": _whole(s.max_processing_s),
        "max_retry_num": s.max_attempts,
        "retry_interval": _whole(s.retry_interval_s),
        "max_retry_interval": _whole(s.retry_cap_s),
        "create_time": None,
        "modify_time": _ms(s.updated_at),
    }
