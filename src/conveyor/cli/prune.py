"""``conveyor prune``: apply retention now (delete old finished jobs), or see what it would."""

from __future__ import annotations

import re
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from ..checks import DEFAULT_RETENTION
from .core import CliError, State, app_option, pass_state
from .render import STATE_STYLES, cell, console, echo_json

#: the states retention applies to, in display order
PRUNABLE = list(DEFAULT_RETENTION)

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
NEVER = {"never", "forever", "none"}
DURATION_HINT = "a number and a unit up to 100 years: 90s, 15m, 12h, 7d, 2w (or never)"
#: longer than any job can be old (PostgreSQL's timestamps overflow far beyond it)
MAX_DURATION_S = 100 * 365 * 86400.0


def parse_duration(text: str) -> float | None:
    """``"90s"`` -> 90.0, ``"7d"`` -> 604800.0, ``"never"`` -> None. ValueError otherwise
    (also past 100 years: say never)."""
    value = text.strip().lower()
    if value in NEVER:
        return None
    match = DURATION.match(value)
    if not match:
        raise ValueError(text)
    value_s = float(match.group(1)) * UNITS[match.group(2)]
    if value_s > MAX_DURATION_S:
        raise ValueError(text)
    return value_s


def parse_older_than(values: tuple[str, ...]) -> dict[str, float | None]:
    """``("succeeded=7d", "failed=never")``: seconds per state (``None``: never)."""
    retention: dict[str, float | None] = {}
    for item in values:
        state, sep, duration = item.partition("=")
        state = state.strip().lower()
        if not sep or not state or not duration.strip():
            raise CliError(
                f"--older-than {item!r}: expected STATE=DURATION, e.g. succeeded=7d "
                f"(states: {', '.join(PRUNABLE)})"
            )
        if state not in PRUNABLE:
            raise CliError(
                f"--older-than {item!r}: {state!r} is not a finished state; retention applies "
                f"to {', '.join(PRUNABLE)}"
            )
        if state in retention:
            raise CliError(f"--older-than {state}=... is given twice")
        try:
            retention[state] = parse_duration(duration)
        except ValueError:
            raise CliError(
                f"--older-than {item!r}: {duration.strip()!r} is not a duration; give "
                f"{DURATION_HINT}"
            ) from None
    return retention


def duration_text(value: float | None) -> str:
    """604800.0 -> "7d"; the largest unit that divides it exactly."""
    if value is None:
        return "kept forever"
    for unit in ("d", "h", "m"):
        size = UNITS[unit]
        if value >= size and value % size == 0:
            return f"{value / size:g}{unit}"
    return f"{value:g}s"


@click.command("prune", short_help="Delete old finished jobs now (retention), or count them.")
@click.option(
    "--older-than",
    "older_than",
    multiple=True,
    metavar="STATE=DURATION",
    help="Retention for one finished state (succeeded, failed, cancelled), e.g. "
    "succeeded=7d or failed=never; repeat for several. Durations: 90s, 15m, 12h, 7d, 2w. "
    "[default: the app's retention, else succeeded=7d failed=30d cancelled=7d]",
)
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@app_option
@pass_state
def prune(state: State, older_than: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Delete finished jobs (with their attempts) older than their state's retention,
    as every worker does once a minute; print how many went per state. Jobs of open
    batches and chain steps not yet advanced are kept.

    \b
    conveyor prune --dry-run
    conveyor prune --older-than succeeded=1d --older-than failed=30d

    A job's age counts from when it finished. Caution: pruning below your workers'
    retention deletes the jobs that mark periodic ticks as done, so a worker started
    later may enqueue a tick still within its grace_s (or catch_up) window again.
    """
    overrides = parse_older_than(older_than)
    app = state.app()
    retention = {**app.retention, **overrides}
    pruned = app.prune(dry_run=dry_run, retention=overrides)
    rows = [(s, retention.get(s), pruned.get(s)) for s in PRUNABLE]
    if as_json:
        data: dict[str, Any] = {
            "dry_run": dry_run,
            "states": {
                s: {"older_than_s": keep, "jobs": n or 0, "kept_forever": keep is None}
                for s, keep, n in rows
            },
        }
        echo_json(data)
        return
    verb = "would be pruned" if dry_run else "pruned"
    table = Table(show_edge=False, header_style="bold")
    table.add_column("state")
    table.add_column("older than", justify="right")
    table.add_column(f"jobs {verb}", justify="right")
    for s, keep, n in rows:
        table.add_row(
            Text(s, style=STATE_STYLES.get(s, "")),
            cell(duration_text(keep), "dim" if keep is None else ""),
            Text("-", style="dim") if keep is None else Text(str(n or 0), style="" if n else "dim"),
        )
    total = sum(n or 0 for _, _, n in rows)
    con = console()
    con.print(table)
    if dry_run:
        con.print(f"dry run: {total} job(s) would be deleted; nothing was deleted")
    else:
        con.print(f"{total} job(s) deleted")
