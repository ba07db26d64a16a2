"""``conveyor queues``: list queues, pause and resume them, cap how many of their jobs run."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from .. import serialize
from ..app import Conveyor
from ..records import JobState, QueueInfo
from .core import CliError, State, app_option, pass_state
from .render import STATE_STYLES, STATES, cell, console, echo_json

#: the largest limit the databases store (a 32-bit integer column on PostgreSQL)
MAX_LIMIT = 2**31 - 1

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@click.group("queues", short_help="List, pause, resume and limit queues.")
def queues_group() -> None:
    """List queues; pause, resume and limit them for every worker at once.

    \b
    conveyor queues list
    conveyor queues pause emails
    conveyor queues resume emails
    conveyor queues limit llm 20       at most 20 llm jobs run at once, cluster-wide
    conveyor queues limit llm --none   remove the limit
    conveyor queues rate llm 100/m     at most 100 llm jobs start a minute, cluster-wide
    """


def full_counts(info: QueueInfo) -> dict[str, int]:
    """Every state present, in display order (the backend omits states with no jobs)."""
    return serialize.state_counts(info.counts)


def paused_text(paused: bool) -> Text:
    return Text("paused", style="bold yellow") if paused else Text("no", style="dim")


def limit_text(max_running: int | None) -> Text:
    return Text("none", style="dim") if max_running is None else Text(str(max_running))


def rate_text(info: QueueInfo) -> Text:
    """A queue's rate limit as it was given: jobs per second, minute or hour."""
    rate = info.rate_per_s
    if rate is None:
        return Text("none", style="dim")
    units = [(u, rate * f) for u, f in (("s", 1), ("m", 60), ("h", 3600))]
    per, n = next(
        (x for x in units if x[1] >= 1 and abs(x[1] - round(x[1])) < 1e-6),  # 100/m, not 1.667/s
        next((x for x in units if x[1] >= 1), units[-1]),
    )
    burst = f" (burst {info.rate_burst:g})" if info.rate_burst is not None else ""
    return Text(f"{n:.4g}/{per}{burst}")


# -- list ----------------------------------------------------------------------------------
@queues_group.command("list")
@json_option
@app_option
@pass_state
def list_queues(state: State, as_json: bool) -> None:
    """List every queue that has jobs or settings: paused or not, its limit on running
    jobs (across every worker), its rate limit, and its jobs per state."""
    queues = state.app().queues()
    if as_json:
        echo_json([serialize.cli_queue(q) for q in queues])
        return
    if not queues:
        console().print("no queues yet (a queue appears with its first job or setting)")
        return
    table = Table(show_edge=False, header_style="bold")
    table.add_column("queue", overflow="fold")
    table.add_column("paused")
    table.add_column("max running", justify="right")
    table.add_column("rate", justify="right")
    for name in STATES:
        table.add_column(name, justify="right", header_style=f"bold {STATE_STYLES[name]}")
    for q in queues:
        counts = full_counts(q)
        table.add_row(
            cell(q.name),
            paused_text(q.paused),
            limit_text(q.max_running),
            rate_text(q),
            *(Text(str(counts[s]), style="" if counts[s] else "dim") for s in STATES),
        )
    console().print(table)


# -- actions -------------------------------------------------------------------------------
def _queue_name(name: str) -> str:
    if not name.strip():
        raise CliError("the queue name is empty")
    return name


def _find(app: Conveyor, name: str) -> QueueInfo | None:
    return next((q for q in app.queues() if q.name == name), None)


def _unknown_note(before: QueueInfo | None) -> str:
    # Settings on a queue nobody uses yet need --force (prepare before deploying);
    # a typo does not pass unnoticed.
    return " (no jobs on it yet)" if before is None else ""


force_option = click.option(
    "--force",
    is_flag=True,
    help="Set up a queue that has no jobs or settings yet (without it, an unknown name "
    "is refused as a likely typo).",
)


@queues_group.command("pause")
@click.argument("name")
@force_option
@app_option
@pass_state
def pause_queue(state: State, name: str, force: bool) -> None:
    """Pause queue NAME for every worker: nothing new is claimed from it; jobs already
    running finish. Undo with `conveyor queues resume NAME`."""
    app = state.app()
    before = _find(app, _queue_name(name))
    if before is not None and before.paused:
        click.echo(f"queue {name!r} is already paused")
        return
    app.pause_queue(name, force=force)
    running = full_counts(before)[JobState.RUNNING] if before else 0
    tail = f"; {running} running job(s) will finish" if running else ""
    click.echo(
        f"queue {name!r} paused: workers claim nothing new from it{tail}{_unknown_note(before)}"
    )


@queues_group.command("resume")
@click.argument("name")
@force_option
@app_option
@pass_state
def resume_queue(state: State, name: str, force: bool) -> None:
    """Resume queue NAME: workers claim from it again."""
    app = state.app()
    before = _find(app, _queue_name(name))
    if before is None or not before.paused:
        click.echo(f"queue {name!r} is not paused: nothing to do")
        return
    app.resume_queue(name, force=force)
    click.echo(f"queue {name!r} resumed: workers claim from it again")


@queues_group.command("limit", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("max_running", metavar="N", type=click.IntRange(0, MAX_LIMIT), required=False)
@click.option("--none", "remove", is_flag=True, help="Remove the limit.")
@force_option
@app_option
@pass_state
def limit_queue(
    state: State, name: str, max_running: int | None, remove: bool, force: bool
) -> None:
    """Let at most N jobs of queue NAME run at once, across every worker; or, with
    --none, remove the limit. Workers apply a change within a second; jobs already
    running above a lowered limit finish.

    \b
    conveyor queues limit llm 20
    conveyor queues limit llm --none
    """
    if remove and max_running is not None:
        raise CliError("give either N or --none, not both")
    if not remove and max_running is None:
        raise CliError(
            "give the most jobs that may run at once (e.g. `conveyor queues limit "
            f"{name} 20`), or --none to remove the limit"
        )
    app = state.app()
    before = _find(app, _queue_name(name))
    was = before.max_running if before else None
    if remove and was is None:
        click.echo(f"queue {name!r} has no limit: nothing to do")
        return
    app.set_queue_limit(name, max_running, force=force)
    if remove:
        click.echo(f"queue {name!r}: limit removed (was {was}); its jobs run as workers allow")
        return
    change = f" (was {was})" if was is not None else ""
    click.echo(
        f"queue {name!r}: at most {max_running} job(s) run at once across every worker"
        f"{change}{_unknown_note(before)}"
    )
    if max_running == 0:
        click.echo("note: with a limit of 0 nothing new starts, as if the queue were paused")


@queues_group.command("rate")
@click.argument("name")
@click.argument("rate_limit", metavar="RATE", required=False)
@click.option(
    "--burst",
    type=click.FloatRange(min=1),
    default=None,
    help="Most tokens the bucket holds (default: one second's worth, at least 1).",
)
@click.option("--none", "remove", is_flag=True, help="Remove the rate limit.")
@force_option
@app_option
@pass_state
def rate_queue(
    state: State,
    name: str,
    rate_limit: str | None,
    burst: float | None,
    remove: bool,
    force: bool,
) -> None:
    """Start at most RATE jobs of queue NAME, across every worker: a token bucket in
    the database (RATE is COUNT/UNIT with unit s, m or h). Jobs over the limit wait
    without using attempts. --none removes it.

    \b
    conveyor queues rate llm 100/m --burst 10
    conveyor queues rate llm --none
    """
    if remove == (rate_limit is not None):
        raise CliError("give either RATE (e.g. 100/m) or --none")
    app = state.app()
    app.set_queue_rate_limit(_queue_name(name), None if remove else rate_limit, burst, force=force)
    if remove:
        click.echo(f"queue {name!r}: rate limit removed")
    else:
        click.echo(
            f"queue {name!r}: at most {rate_limit} across every worker"
            + (f", bursts of up to {burst:g}" if burst else "")
        )
