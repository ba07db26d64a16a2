"""asyncflow compatibility (seed 001): flowsvr's routes under ``/api``, with its
field names, its envelope ``{"code": 0, "msg": "ok", "result": ...}`` and its
numeric statuses (1 waiting, 2 running, 3 succeeded, 4 failed or cancelled).

A task is a Conveyor job: ``taskType`` is the task name (compared ignoring case:
flowsvr folds a type to lower case, so the seed creates ``Lark`` and its worker
holds ``lark``), ``userId`` the tenant,
``taskStage`` the stage, ``taskContext`` the context (a JSON string on the
wire), ``taskId`` the job id. ``hold_task`` claims under the pseudo worker
``asyncflow`` with a deadline (the task type's ``max_processing_s``, else 30 s),
never handing a task out twice; ``setTask`` ends the held attempt as the seed's
worker means it, fenced like any remote outcome, but under the token of whoever
holds the task now: asyncflow's holds carry no token, so a ``setTask`` from a
hold whose deadline passed is refused only until the task is held again (the
limit the server guide states). The mapping is in the README.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from ... import serialize
from ...app import Conveyor
from ...errors import ConfigError, Conflict
from ...outcomes import OutcomeKind, RemoteOutcome
from ...records import JobFilter, JobRecord, JobState
from ..auth import PRODUCER, READ, WORKER, requires
from ..context import ServerContext
from ..dependencies import Ctx, Facade
from ..errors import envelope
from ..models import (
    MAX_SECONDS,
    Attempts,
    Key,
    Name,
    Priority,
    Seconds,
    Tenant,
    Text,
    clean_text,
    printable,
)

#: asyncflow status -> Conveyor states
STATES: dict[int, tuple[JobState, ...]] = {
    1: (JobState.SCHEDULED, JobState.AVAILABLE),
    2: (JobState.RUNNING,),
    3: (JobState.SUCCEEDED,),
    4: (JobState.FAILED, JobState.CANCELLED),
}
Status = Annotated[
    int, Field(ge=1, le=4, description="1 waiting, 2 running, 3 succeeded, 4 failed")
]
Stage = Annotated[
    str, StringConstraints(max_length=200), AfterValidator(clean_text), AfterValidator(printable)
]
JsonText = Annotated[str, StringConstraints(max_length=16 << 20), AfterValidator(clean_text)]
#: orderTime and the other times are milliseconds since the epoch
Millis = Annotated[int, Field(ge=0, le=int((time.time() + MAX_SECONDS) * 1000))]
TaskId = Annotated[str, StringConstraints(min_length=1, max_length=40), AfterValidator(clean_text)]
Limit = Annotated[int, Field(ge=1, le=1000)]


class Compat(BaseModel):
    """asyncflow clients may send fields Conveyor derives itself (crtRetryNum,
    createTime, ...): those are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")


class TaskData(Compat):
    taskType: Name
    userId: Tenant | None = None
    taskStage: Stage = ""
    scheduleLog: Text = ""
    taskContext: JsonText = ""
    priority: Priority | None = None
    orderTime: Millis | None = Field(None, description="when it may run (ms since the epoch)")
    maxRetryNum: Attempts | None = None
    maxRetryInterval: Seconds | None = None


class CreateTask(Compat):
    taskData: TaskData


class SetTask(Compat):
    taskId: TaskId
    status: Status
    taskStage: Stage = ""
    scheduleLog: Text = ""
    taskContext: JsonText | None = None
    orderTime: Millis | None = None
    priority: Priority | None = None
    crtRetryNum: int | None = Field(None, description="ignored: Conveyor counts attempts itself")
    maxRetryNum: Attempts | None = None
    maxRetryInterval: Seconds | None = None


def _context(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise ConfigError('taskContext must be a JSON string, e.g. "{\\"k\\": 1}"') from None


def _error(schedule_log: str, default: str) -> str:
    """The ErrMsg a worker put in scheduleLog (its LastData), else ``default``."""
    if not schedule_log.strip():
        return default
    try:
        data = json.loads(schedule_log)
    except (ValueError, RecursionError):
        return schedule_log
    last = data.get("LastData") if isinstance(data, dict) else None
    if isinstance(last, dict) and last.get("ErrMsg"):
        return str(last["ErrMsg"])
    return default


def _task_id(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 2**63:
        raise ConfigError(f"taskId: {text!r} is not a task id this server returned")
    return int(text)


def _delay_until(millis: int | None) -> float | None:
    return None if millis is None else max(0.0, millis / 1000 - time.time())


def _named_like(task_type: str, *names: Iterable[str]) -> list[str]:
    folded = task_type.lower()
    return sorted({n for group in names for n in group if n.lower() == folded})


router = APIRouter(tags=["asyncflow compatibility"])


def tasks_out(app: Conveyor, jobs: Sequence[JobRecord]) -> list[dict[str, Any]]:
    return [
        serialize.asyncflow_task(
            j,
            app.job_attempts(j.id),
            retry_cap_s=app.plumbing.task_for(j.task).defaults.backoff.cap,
        )
        for j in jobs
    ]


def deadline(ctx: ServerContext, task: str) -> float:
    s = ctx.conveyor.serving.cached_task_settings().get(task)
    return (s.max_processing_s if s else None) or ctx.asyncflow_deadline_s


def task_name(app: Conveyor, task_type: str) -> str:
    """The task a type's new tasks are jobs of: a registered task, else a type
    with settings, of that name in any case; else the name in lower case."""
    for names in (app.tasks, app.serving.cached_task_settings()):
        if same := _named_like(task_type, names):
            return same[0]
    return task_type.lower()


def task_names(app: Conveyor, task_type: str) -> list[str]:
    """Every task a type stands for: the one ``task_name`` picks now and any
    other of its names (tasks created before a type got settings, say)."""
    return _named_like(
        task_type, app.tasks, app.serving.cached_task_settings(), [task_type.lower()]
    )


@router.post(
    "/task_schedule_cfg/list",
    summary="Task types' settings (t_schedule_cfg)",
    dependencies=[requires(READ)],
)
def schedule_cfg_list(app: Facade) -> Any:
    rows = [serialize.asyncflow_settings(s) for s in app.task_settings()]
    return envelope(0, "ok", {"scheduleCfgList": rows})


@router.post("/task/createTask", summary="Create a task", dependencies=[requires(PRODUCER)])
def create_task(body: CreateTask, app: Facade) -> Any:
    d = body.taskData
    options: dict[str, Any] = {
        "tenant": d.userId or None,
        "stage": d.taskStage or None,
        "context": _context(d.taskContext),
        "priority": d.priority,
        "max_attempts": d.maxRetryNum,
        "delay": _delay_until(d.orderTime),
        "backoff": None if d.maxRetryInterval is None else {"cap": d.maxRetryInterval},
    }
    job = app.enqueue(
        task_name(app, d.taskType), **{k: v for k, v in options.items() if v is not None}
    )
    return envelope(0, "ok", {"taskId": str(job.id)})


@router.get("/task/getTask", summary="A task by id", dependencies=[requires(READ)])
def get_task(taskId: Annotated[TaskId, Query()], app: Facade) -> Any:
    job = app.get_job(_task_id(taskId))
    return envelope(0, "ok", {"taskData": tasks_out(app, [job])[0]})


@router.get(
    "/task/getTaskList",
    summary="Tasks of a type in a status",
    dependencies=[requires(READ)],
)
def get_task_list(
    taskType: Annotated[Name, Query()],
    status: Annotated[Status, Query()],
    app: Facade,
    limit: Annotated[Limit, Query()] = 100,
) -> Any:
    f = JobFilter(tasks=tuple(task_names(app, taskType)), states=STATES[status])
    return envelope(0, "ok", {"taskList": tasks_out(app, app.list_jobs(f, limit=limit))})


@router.get(
    "/task/getUserTaskList",
    summary="A user's tasks in some statuses",
    dependencies=[requires(READ)],
)
def get_user_task_list(
    userId: Annotated[Key, Query()],
    app: Facade,
    statusList: Annotated[str | None, Query(max_length=20, pattern=r"^[1-4](,[1-4])*$")] = None,
    limit: Annotated[Limit, Query()] = 100,
) -> Any:
    states = None
    if statusList:
        states = tuple(
            s for n in sorted({int(x) for x in statusList.split(",")}) for s in STATES[n]
        )
    f = JobFilter(tenant=userId, states=states)
    return envelope(0, "ok", {"taskList": tasks_out(app, app.list_jobs(f, limit=limit))})


@router.post(
    "/task/hold_task",
    summary="Claim waiting tasks of a type",
    dependencies=[requires(WORKER)],
)
def hold_task(
    taskType: Annotated[Name, Query()],
    ctx: Ctx,
    status: Annotated[Status, Query()] = 1,
    limit: Annotated[Limit | None, Query()] = None,
) -> Any:
    """Returns the tasks as they are after the claim (status 2); a task held here
    is handed to nobody else until it is set, or its deadline passes."""
    if status != 1:
        raise ConfigError("status: only waiting tasks (status 1) can be held")
    app = ctx.conveyor
    name, names = task_name(app, taskType), task_names(app, taskType)
    s = app.serving.cached_task_settings().get(name)
    jobs = app.serving.claim(
        ctx.asyncflow_worker,
        sorted({app.plumbing.task_for(n).defaults.queue for n in names}),
        limit=limit or (s.batch_size if s and s.batch_size else 10),
        tasks=names,
        lease_s=deadline(ctx, name),
    )
    return envelope(0, "ok", {"taskList": tasks_out(app, jobs)})


@router.post("/task/setTask", summary="Update a held task", dependencies=[requires(WORKER)])
def set_task(body: SetTask, ctx: Ctx) -> Any:
    """As the seed's worker means it: status 1 with a new ``taskStage`` moves the
    task to that stage (back in the queue); status 1 with the same stage is a
    retry (``orderTime`` or the backoff says when); 2 keeps holding it (its
    deadline starts again); 3 succeeded (the context is its result); 4 failed."""
    app = ctx.conveyor
    job = app.get_job(_task_id(body.taskId))
    if job.state != JobState.RUNNING or job.lease_owner != ctx.asyncflow_worker:
        raise Conflict(
            f"task {job.id} is not held through hold_task (status "
            f"{serialize.ASYNCFLOW_STATUS[job.state]}): hold it first"
        )
    token = job.lease_token or ""
    if body.status == 2:
        if not app.serving.extend_deadline(job.id, token, deadline(ctx, task_name(app, job.task))):
            raise Conflict(f"task {job.id}: the hold was lost meanwhile")
        return envelope(0, "ok", None)
    outcome = _outcome(job, token, body)
    [result] = app.serving.report(ctx.asyncflow_worker, [outcome])
    if not result.accepted:
        raise Conflict(result.message)
    return envelope(0, "ok", None)


def _outcome(job: JobRecord, token: str, body: SetTask) -> RemoteOutcome:
    common: dict[str, Any] = {"priority": body.priority, "max_attempts": body.maxRetryNum}
    if body.status == 3:
        return RemoteOutcome(
            job.id, token, OutcomeKind.COMPLETE, result=_context(body.taskContext), **common
        )
    if body.status == 4:
        error = _error(body.scheduleLog, "failed (setTask status 4)")
        return RemoteOutcome(job.id, token, OutcomeKind.FAIL, error=error, permanent=True, **common)
    if body.taskStage and body.taskStage != (job.stage or ""):
        context = job.context if body.taskContext is None else _context(body.taskContext)
        return RemoteOutcome(
            job.id,
            token,
            OutcomeKind.NEXT_STAGE,
            stage=body.taskStage,
            context=context,
            delay_s=_delay_until(body.orderTime) or 0.0,
            **common,
        )
    return RemoteOutcome(
        job.id,
        token,
        OutcomeKind.FAIL,
        error=_error(body.scheduleLog, "retry requested (setTask status 1)"),
        retry_in_s=_delay_until(body.orderTime),
        retry_cap_s=body.maxRetryInterval,
        **common,
    )
