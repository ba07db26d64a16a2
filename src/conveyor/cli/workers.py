"""``conveyor workers``: list the registered workers, ask one to stop."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from .. import serialize
from .core import CliError, State, app_option, pass_state
from .render import cell, console, echo_json, seconds, when
from .status import STALE_S, _age, is_silent, last_seen_cell, silent_caption


@click.group("workers", short_help="List the workers; stop one remotely.")
def workers_group() -> None:
    """List the workers and stop one remotely (start them with `conveyor worker`).

    \b
    conveyor workers list
    conveyor workers stop myhost:4242:9f3a
    """


@workers_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@app_option
@pass_state
def list_workers(state: State, as_json: bool) -> None:
    """List the registered workers: where they run, what they take, when they last
    heartbeat. A worker silent for over a minute is flagged: it most likely died
    without deregistering (it is forgotten after a few minutes)."""
    workers = state.app().workers()
    if as_json:
        echo_json([serialize.cli_worker(w, silent_after_s=STALE_S) for w in workers])
        return
    if not workers:
        console().print("no workers running")
        return
    table = Table(show_edge=False, header_style="bold")
    for name in ("id", "host", "pid", "queues", "concurrency", "started", "last seen", "status"):
        table.add_column(
            name,
            justify="right" if name in ("pid", "concurrency") else "left",
            overflow="fold",
        )
    for w in workers:
        silent = is_silent(w)
        table.add_row(
            cell(w.id),
            cell(w.hostname),
            cell(w.pid),
            cell(",".join(w.queues)),
            cell(w.concurrency),
            cell(when(w.started_at)),
            last_seen_cell(w),
            Text("silent", style="bold red") if silent else Text("alive", style="green"),
        )
    stale = sum(is_silent(w) for w in workers)
    if stale:
        table.caption = silent_caption(stale)
        table.caption_justify = "left"
    console().print(table)


@workers_group.command("stop")
@click.argument("worker_id", metavar="ID")
@app_option
@pass_state
def stop_worker(state: State, worker_id: str) -> None:
    """Ask worker ID (see `conveyor workers list`) to stop: it claims nothing new,
    lets its running jobs finish (up to its --grace), then exits with status 0. It
    learns at its next heartbeat (every lease/3 seconds, 10 s by default; sooner on
    PostgreSQL)."""
    app = state.app()
    worker = next((w for w in app.workers() if w.id == worker_id), None)
    if worker is None or not app.stop_worker(worker_id):
        raise CliError(
            f"no worker with id {worker_id!r} (it may have exited already; "
            "`conveyor workers list` shows the registered ones)"
        )
    click.echo(
        f"worker {worker_id} (pid {worker.pid} on {worker.hostname}) asked to stop: it claims "
        "nothing new, finishes its running jobs and exits (at its next heartbeat)"
    )
    if is_silent(worker):
        age = _age(worker)
        click.echo(
            f"note: it has not been heard from for {seconds(age)}: it may be gone already, "
            "and then will never act on this"
        )
