"""Turning jobs, attempts and counts into rich tables or JSON."""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from .. import serialize
from ..records import STATE_ORDER, Attempt, JobRecord, JobState

#: display order of states, also the columns of `conveyor status`
STATES = [s.value for s in STATE_ORDER]

STATE_STYLES: dict[str, str] = {
    JobState.SCHEDULED: "cyan",
    JobState.AVAILABLE: "blue",
    JobState.RUNNING: "yellow",
    JobState.SUCCEEDED: "green",
    JobState.FAILED: "red",
    JobState.CANCELLED: "dim",
}


def console() -> Console:
    """A console on the current stdout. Piped output gets a generous width so tables
    are not squeezed to 80 columns in logs and CI."""
    con = Console(highlight=False)
    if not con.is_terminal and "COLUMNS" not in os.environ:
        con.width = 160
    return con


def cell(value: Any, style: str = "") -> Text:
    """A table cell that is never parsed as rich markup (errors contain brackets)."""
    return Text("" if value is None else str(value), style=style)


def state_text(state: str | JobState) -> Text:
    value = str(state)
    return Text(value, style=STATE_STYLES.get(value, ""))


def when(ts: datetime | None) -> str:
    """Local time, to the second: what an operator compares with their own logs."""
    return "" if ts is None else ts.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def seconds(value: float | None) -> str:
    if value is None:
        return ""
    if value < 60:
        return f"{value:.2f}s" if value < 10 else f"{value:.1f}s"
    minutes, secs = divmod(round(value), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def snippet(text: str | None, width: int = 60) -> str:
    """First line of an error, shortened for a table cell."""
    if not text:
        return ""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= width else first[: width - 1] + "…"


# -- JSON --------------------------------------------------------------------------------
def job_dict(job: JobRecord) -> dict[str, Any]:
    return serialize.job(job)


def attempt_dict(attempt: Attempt) -> dict[str, Any]:
    return serialize.attempt(attempt)


def echo_json(data: Any) -> None:
    # click.echo, not rich: machine output must carry no markup or wrapping.
    click.echo(json.dumps(serialize.plain(data), indent=2, default=str))
