"""``/v1/tasks``: task types and their settings (seed 001's t_schedule_cfg).
A change applies at once to the task's waiting jobs not sent with their own
values, so every worker picks it up at its next claim. Precedence: a job's own
send options, then these settings, then the decorator's defaults."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from pydantic import Field

from ... import serialize
from ...errors import JobNotFound
from ..auth import ADMIN, READ, requires
from ..dependencies import Facade
from ..models import Name, Strict

TaskPath = Annotated[Name, Path(description="the task type's name")]


Count = Annotated[int, Field(strict=True)]
Secs = Annotated[float, Field(allow_inf_nan=False)]


class SettingsPatch(Strict):
    """Fields to change; ``null`` unsets one (the decorator's default applies).
    Bounds are checked by the façade (``conveyor.settings.LIMITS``), naming the field."""

    batch_size: Count | None = Field(None, description="jobs a remote worker leases at once")
    poll_interval_s: Secs | None = Field(
        None, description="seconds remote workers are told to wait between polls"
    )
    max_processing_s: Secs | None = Field(
        None, description="the job timeout; for remote holders, the lease deadline"
    )
    max_attempts: Count | None = Field(None, description="attempts before a job fails for good")
    retry_interval_s: Secs | None = Field(None, description="the first retry delay (doubling)")
    retry_cap_s: Secs | None = Field(None, description="the longest retry delay")


router = APIRouter(tags=["tasks"])


@router.get(
    "/tasks",
    summary="Task types: registered here or with settings",
    dependencies=[requires(READ)],
)
def list_tasks(app: Facade) -> Any:
    stored = {s.task: s for s in app.task_settings()}
    names = sorted(set(app.tasks) | set(stored))
    return {
        "tasks": [
            {
                "task": name,
                "registered": name in app.tasks,
                "settings": serialize.task_settings(
                    stored.get(name) or app.get_task_settings(name)
                ),
            }
            for name in names
        ]
    }


@router.get(
    "/tasks/{task}/settings",
    summary="A task type's settings",
    dependencies=[requires(READ)],
)
def get_settings(task: TaskPath, app: Facade) -> Any:
    return serialize.task_settings(app.get_task_settings(task))


@router.patch(
    "/tasks/{task}/settings",
    summary="Change a task type's settings",
    dependencies=[requires(ADMIN)],
)
def set_settings(task: TaskPath, body: SettingsPatch, app: Facade) -> Any:
    return serialize.task_settings(
        app.set_task_settings(task, **body.model_dump(exclude_unset=True))
    )


@router.delete(
    "/tasks/{task}/settings",
    status_code=204,
    summary="Forget a task type's settings",
    dependencies=[requires(ADMIN)],
)
def delete_settings(task: TaskPath, app: Facade) -> Response:
    if not app.delete_task_settings(task):
        raise JobNotFound(f"task {task!r} has no settings")
    return Response(status_code=204)
