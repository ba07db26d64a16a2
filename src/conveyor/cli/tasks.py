"""``conveyor tasks settings``: per-task-type settings stored in the database."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from .. import serialize
from ..records import TaskSettings
from ..settings import FIELDS
from .core import CliError, State, app_option, pass_state
from .render import cell, console, echo_json, when
from .tokens import current

#: CLI option -> settings field
OPTIONS = {
    "batch_size": ("--batch-size", int, "Jobs a remote worker leases at once."),
    "poll_interval_s": ("--poll-interval", float, "Seconds remote workers wait between polls."),
    "max_processing_s": (
        "--max-processing",
        float,
        "Seconds one attempt may run (the timeout; remote holders' lease deadline).",
    ),
    "max_attempts": ("--max-attempts", int, "Attempts before a job fails for good."),
    "retry_interval_s": ("--retry-interval", float, "First retry delay, in seconds (doubling)."),
    "retry_cap_s": ("--retry-cap", float, "Longest retry delay, in seconds."),
}


@click.group("tasks", short_help="Task types: their settings in the database.")
def tasks_group() -> None:
    """Task types and the settings stored for them in the database."""


@tasks_group.group("settings")
def settings_group() -> None:
    """Per-task-type settings, applied by every worker without a redeploy.

    \b
    conveyor tasks settings list
    conveyor tasks settings show resize
    conveyor tasks settings set resize --max-attempts 3 --retry-interval 5 --retry-cap 30
    conveyor tasks settings set resize --unset max_attempts

    Precedence: a job's own send options, then these settings, then the task
    decorator's defaults. A change applies at once to the task's waiting jobs
    that were not sent with their own values. batch_size and poll_interval are
    what remote workers are told; in-process workers use their own flags.
    """


def _row(s: TaskSettings) -> list[Any]:
    return [cell(s.task), *(cell(getattr(s, f)) for f in FIELDS), cell(when(s.updated_at))]


def _table(rows: list[TaskSettings]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    table.add_column("task", overflow="fold")
    for f in FIELDS:
        table.add_column(f, justify="right")
    table.add_column("updated")
    for s in rows:
        table.add_row(*_row(s))
    return table


@settings_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@app_option
@pass_state
def list_settings(state: State, as_json: bool) -> None:
    """Every task type that has settings."""
    rows = current(state.app()).task_settings()
    if as_json:
        echo_json([serialize.task_settings(s) for s in rows])
        return
    if not rows:
        console().print("no task settings yet (`conveyor tasks settings set TASK ...`)")
        return
    console().print(_table(rows))


@settings_group.command("show")
@click.argument("task")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@app_option
@pass_state
def show(state: State, task: str, as_json: bool) -> None:
    """One task type's settings (empty fields: the decorator's defaults apply)."""
    s = current(state.app()).get_task_settings(task)
    if as_json:
        echo_json(serialize.task_settings(s))
        return
    console().print(_table([s]))


def _set_options(fn: Any) -> Any:
    for field, (flag, kind, text) in reversed(OPTIONS.items()):
        fn = click.option(flag, field, type=kind, default=None, help=text)(fn)
    return fn


@settings_group.command("set")
@click.argument("task")
@_set_options
@click.option(
    "--unset",
    multiple=True,
    type=click.Choice(list(FIELDS)),
    help="Unset a field (the decorator's default applies again). Repeatable.",
)
@app_option
@pass_state
def set_settings(state: State, /, task: str, unset: tuple[str, ...], **values: Any) -> None:
    """Change some settings of TASK; fields not given keep their value."""
    fields = {k: v for k, v in values.items() if v is not None}
    fields.update(dict.fromkeys(unset))
    if not fields:
        raise CliError("nothing to set: pass at least one option (see --help)")
    s = state.app(auto_migrate=True).set_task_settings(task, **fields)
    console().print(_table([s]))
