"""``conveyor periodic``: the app's cron schedules and when each fires next."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click
from croniter import CroniterBadDateError, croniter
from rich.table import Table

from ..cron import Periodic
from ..task import Task
from .core import State, app_option, pass_state
from .render import cell, console, echo_json, seconds

#: how many candidate ticks next_tick looks at (it skips the repeated wall times of
#: a fall-back night for fixed-time schedules: at most a handful in a row)
LOOKAHEAD = 16


@click.group("periodic", short_help="The app's cron schedules and their next ticks.")
def periodic_group() -> None:
    """Inspect the periodic (cron) tasks your app declares with @app.periodic.

    \b
    conveyor periodic list --app myapp:app
    """


def next_tick(p: Periodic, now: datetime) -> datetime | None:
    """The schedule's first tick after ``now``, in UTC (``None``: it never fires again).

    Display only: follows the rules of :func:`conveyor.cron.due_ticks` (a fixed-time
    schedule fires once in a repeated hour, at the first occurrence).
    """
    it = croniter(p.cron, now.astimezone(p.zone))
    try:
        for _ in range(LOOKAHEAD):
            tick = it.get_next(datetime).astimezone(UTC)
            if tick.astimezone(p.zone).fold and not p.wild:
                continue  # the second occurrence of a wall time: not a tick
            return tick
    except CroniterBadDateError:
        return None
    return None


def until(s: float) -> str:
    """Time to the next tick: seconds and minutes as elsewhere, days past two days."""
    if s < 2 * 86400:
        return seconds(s)
    days, rest = divmod(round(s), 86400)
    return f"{days}d{rest // 3600:02d}h"


def policy_text(p: Periodic) -> str:
    if p.missed == "catch_up":
        return f"catch up {p.catch_up}"
    return f"skip (grace {p.grace_s:g}s)"


def queue_of(p: Periodic) -> str | None:
    return p.task.defaults.queue if isinstance(p.task, Task) else None


def periodic_dict(p: Periodic, nxt: datetime | None, now: datetime) -> dict[str, Any]:
    return {
        "name": p.name,
        "task": p.task_name,
        "queue": queue_of(p),
        "cron": p.cron,
        "timezone": p.timezone,
        "missed": p.missed,
        "catch_up": p.catch_up,
        "grace_s": p.grace_s,
        "args": list(p.args),
        "kwargs": dict(p.kwargs),
        "next_tick_utc": nxt,
        "next_tick_local": None if nxt is None else nxt.astimezone(p.zone),
        "next_tick_in_s": None if nxt is None else (nxt - now).total_seconds(),
    }


@periodic_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@app_option
@pass_state
def list_periodics(state: State, as_json: bool) -> None:
    """List the app's schedules: task, cron expression, time zone, policy for missed
    ticks, and the next tick in UTC and in the schedule's own zone.

    Reads only your app (no database): the ticks are computed here, from this
    machine's clock, as workers do from theirs.
    """
    app = state.app(need_tasks=True)
    now = datetime.now(UTC)
    rows = [(p, next_tick(p, now)) for p in sorted(app.periodics.values(), key=lambda p: p.name)]
    if as_json:
        echo_json([periodic_dict(p, nxt, now) for p, nxt in rows])
        return
    if not rows:
        console().print(f"no periodic tasks: {state.app_spec} declares no @app.periodic schedule")
        return
    table = Table(show_edge=False, header_style="bold")
    for name in ("name", "task", "queue", "cron", "timezone", "missed ticks"):
        table.add_column(name, overflow="fold")
    table.add_column("next tick (UTC)")
    table.add_column("next tick (its zone)")
    table.add_column("in", justify="right")
    for p, nxt in rows:
        table.add_row(
            cell(p.name),
            cell(p.task_name),
            cell(queue_of(p)),
            cell(p.cron),
            cell(p.timezone),
            cell(policy_text(p)),
            cell("never" if nxt is None else nxt.strftime("%Y-%m-%d %H:%M:%S UTC")),
            cell("" if nxt is None else nxt.astimezone(p.zone).strftime("%Y-%m-%d %H:%M:%S %Z")),
            cell("" if nxt is None else until((nxt - now).total_seconds())),
        )
    console().print(table)
