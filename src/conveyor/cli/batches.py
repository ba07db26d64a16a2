"""``conveyor batches``: list, show (and follow), cancel and retry batches."""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .. import serialize
from ..batch import Batch
from ..records import BatchState, JobState
from .core import State, app_option, pass_state, refuse
from .render import cell, console, echo_json, seconds, when

#: batch states, in the order a batch goes through them
BATCH_STATES = [s.value for s in BatchState]

BATCH_STYLES: dict[str, str] = {
    BatchState.RUNNING: "yellow",
    BatchState.SUCCEEDED: "green",
    BatchState.COMPLETED_WITH_FAILURES: "red",
    BatchState.CALLBACK_FAILED: "red",
    BatchState.CANCELLED: "dim",
}

#: the job counts progress() reports, in display order, with their colours
PROGRESS_COUNTS = [
    (JobState.SUCCEEDED, "green"),
    (JobState.FAILED, "red"),
    (JobState.CANCELLED, "dim"),
    (JobState.RUNNING, "yellow"),
    ("pending", "cyan"),
]

#: --follow: how often the bar is redrawn (and the database asked), and how often a
#: progress line is printed when stdout is not a terminal
FOLLOW_POLL_S = 0.25
FOLLOW_LINE_S = 1.0

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@click.group("batches")
def batches_group() -> None:
    """Inspect and operate on batches (created with task.batch(...)).

    \b
    conveyor batches list --state running
    conveyor batches show 7 --follow
    conveyor batches cancel 7
    conveyor batches retry-failed 7
    """


def batch_state_text(state: str) -> Text:
    return Text(state, style=BATCH_STYLES.get(state, ""))


def callback_name(batch: Batch) -> str | None:
    """The task ``on_complete`` names, if the batch has one."""
    on_complete = batch.record.on_complete
    return on_complete.get("task") if on_complete else None


# -- list ----------------------------------------------------------------------------------
@batches_group.command("list")
@click.option(
    "--state", "state_filter", type=click.Choice(BATCH_STATES), help="Only batches in this state."
)
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 1_000),
    default=50,
    show_default=True,
    help="Most batches to show (newest first).",
)
@json_option
@app_option
@pass_state
def list_batches(state: State, state_filter: str | None, limit: int, as_json: bool) -> None:
    """List batches, newest first, with the progress of each."""
    batches = state.app().list_batches(state=state_filter, limit=limit)
    rows = [(b, b.progress()) for b in batches]
    if as_json:
        echo_json([serialize.cli_batch(b.record, p) for b, p in rows])
        return
    if not rows:
        console().print("no batches match" if state_filter else "no batches yet")
        return
    console().print(batches_table(rows))


def batches_table(rows: list[tuple[Batch, dict[str, Any]]]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("name", overflow="fold")
    table.add_column("task", overflow="fold")
    table.add_column("state", overflow="fold")
    table.add_column("total", justify="right")
    for name, style in PROGRESS_COUNTS:
        table.add_column(name, justify="right", header_style=f"bold {style}")
    table.add_column("created", overflow="fold")
    table.add_column("finished", overflow="fold")
    for b, p in rows:
        state = batch_state_text(p["state"])
        if p["state"] == BatchState.RUNNING:
            state.append(f" {p['percent']}%")
        table.add_row(
            cell(b.id),
            cell(b.name),
            cell(b.record.task),
            state,
            cell(b.total),
            *(cell(p[name], style if p[name] else "dim") for name, style in PROGRESS_COUNTS),
            cell(when(b.record.created_at)),
            cell(when(b.record.finished_at)),
        )
    return table


# -- show ----------------------------------------------------------------------------------
@batches_group.command("show")
@click.argument("batch_id", type=int, metavar="ID")
@json_option
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Follow the batch until it closes: a live progress bar (a line a second when "
    "stdout is not a terminal), then its final state and counts. Ctrl-C stops following. "
    "With --json, waits quietly and prints the closed batch.",
)
@app_option
@pass_state
def show_batch(state: State, batch_id: int, as_json: bool, follow: bool) -> None:
    """Show one batch: every field, its progress and ETA.

    A batch is closed by a running worker once none of its jobs is left to run, so
    --follow only ends while some worker runs.
    """
    app = state.app()
    batch = app.get_batch(batch_id)  # a missing id is an error of its own
    if follow:
        closed = follow_batch(batch, console(), quiet=as_json)
        if closed is None:  # Ctrl-C
            return
        if as_json:
            echo_json(serialize.cli_batch(closed.record, closed.progress()))
        else:
            console().print(final_line(closed))
        return
    progress = batch.progress()
    batch = batch.refresh()  # the record at least as fresh as the counts
    progress["state"] = batch.state
    if as_json:
        echo_json(serialize.cli_batch(batch.record, progress))
        return
    console().print(batch_fields(batch, progress))


def batch_fields(batch: Batch, p: dict[str, Any]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", justify="right")
    grid.add_column(overflow="fold")
    r = batch.record
    running = p["state"] == BatchState.RUNNING
    done = p[JobState.SUCCEEDED] + p[JobState.FAILED] + p[JobState.CANCELLED]
    rows: list[tuple[str, Any]] = [
        ("batch", Text(f"{r.id}", style="bold")),
        ("name", r.name),
        ("task", r.task),
        ("state", batch_state_text(p["state"])),
        ("jobs", counts_text(p)),
        ("done", f"{done} of {r.total} ({p['percent']}%)"),
        ("eta", eta_text(p) if running else None),
        ("final counts", counts_text(r.counts) if r.counts and not running else None),
        ("created", when(r.created_at)),
        ("finished", when(r.finished_at)),
        ("cancelled at", when(r.cancelled_at)),
        ("took", seconds(_took(batch)) if r.finished_at and not running else None),
        ("idempotency key", r.idempotency_key),
        ("on complete", _on_complete_text(batch)),
    ]
    if running and r.cancelled_at:
        rows.append(("note", "cancelled: closes as cancelled once its running jobs finish"))
    for name, value in rows:
        if value is None or value == "":
            continue
        grid.add_row(name, value if isinstance(value, Text) else cell(value))
    return grid


def _took(batch: Batch) -> float | None:
    r = batch.record
    return None if r.finished_at is None else (r.finished_at - r.created_at).total_seconds()


def _on_complete_text(batch: Batch) -> str | None:
    name = callback_name(batch)
    if name is None:
        return None
    closings = batch.record.closings
    when_ = f"called {closings} time(s)" if closings else "called once the batch closes"
    return f"{name}(batch_id, counts): {when_}"


def counts_text(counts: dict[str, int]) -> Text:
    """``5 succeeded, 1 failed, ...``: the progress() counts, or a closed batch's
    final counts per job state."""
    names = [name for name, _ in PROGRESS_COUNTS]
    styles = dict(PROGRESS_COUNTS)
    if "pending" not in counts:  # final counts: per job state, only those present
        names = [n for n in names if n in counts] + sorted(
            n for n in counts if n not in styles and n != "total"
        )
    text = Text()
    for i, name in enumerate(names):
        if i:
            text.append(", ")
        n = counts.get(name, 0)
        text.append(f"{n} {name}", style=styles.get(name, "") if n else "dim")
    return text if names else Text("no jobs", style="dim")


def eta_text(p: dict[str, Any]) -> str:
    if p["eta_s"] is None:
        return "unknown until a job finishes"
    if p["eta_s"] == 0 and p["state"] == BatchState.RUNNING:
        return "every job is done; closes when a worker's flow service next looks"
    return f"about {seconds(p['eta_s'])}"


def final_line(batch: Batch) -> Text:
    r = batch.record
    text = Text.assemble(
        f"batch {r.id}" + (f" ({r.name})" if r.name else "") + " closed: ",
        batch_state_text(r.state),
    )
    if r.counts is not None:
        text.append(" - ")
        text.append_text(counts_text(r.counts))
    return text


# -- follow --------------------------------------------------------------------------------
def follow_batch(batch: Batch, con: Console, *, quiet: bool = False) -> Batch | None:
    """Watch until the batch closes and return it closed; ``None`` after Ctrl-C."""
    try:
        if quiet:
            while not batch.finished:
                time.sleep(FOLLOW_POLL_S)
                batch = batch.refresh()
            return batch
        if con.is_interactive:
            return _follow_bar(batch, con)
        return _follow_lines(batch, con)
    except KeyboardInterrupt:
        # stderr: stdout may be piped into something that expects only batch output
        click.echo(f"stopped following batch {batch.id} (it goes on without you)", err=True)
        return None


def _describe(p: dict[str, Any]) -> str:
    parts = [f"[{style}]{p[name]} {name}[/]" for name, style in PROGRESS_COUNTS if p[name]]
    return " ".join(parts) or "[dim]no jobs[/]"


def _follow_bar(batch: Batch, con: Console) -> Batch:
    title = f"batch {batch.id}" + (f" ({batch.name})" if batch.name else "")
    columns = (
        # the name is the user's: never read as a format string or as markup
        TextColumn("{task.fields[title]}", markup=False, style="bold"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[eta]}"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=con, refresh_per_second=4, transient=False) as bar:
        task = bar.add_task("", total=batch.total, eta="", title=title)
        while True:
            p = batch.progress()
            done = p[JobState.SUCCEEDED] + p[JobState.FAILED] + p[JobState.CANCELLED]
            eta = f"eta {seconds(p['eta_s'])}" if p["eta_s"] else ""
            bar.update(task, completed=done, total=p["total"], description=_describe(p), eta=eta)
            if p["state"] != BatchState.RUNNING:
                return batch.refresh()
            time.sleep(FOLLOW_POLL_S)


def _follow_lines(batch: Batch, con: Console) -> Batch:
    last_line = 0.0
    while True:
        p = batch.progress()
        if p["state"] != BatchState.RUNNING:
            return batch.refresh()
        if time.monotonic() - last_line >= FOLLOW_LINE_S:
            last_line = time.monotonic()
            con.print(progress_line(batch, p))
        time.sleep(FOLLOW_POLL_S)


def progress_line(batch: Batch, p: dict[str, Any]) -> Text:
    done = p[JobState.SUCCEEDED] + p[JobState.FAILED] + p[JobState.CANCELLED]
    text = Text(f"batch {batch.id}: {done}/{p['total']} done ({p['percent']}%): ")
    text.append_text(counts_text(p))
    if p["eta_s"]:
        text.append(f"; eta {seconds(p['eta_s'])}")
    return text


# -- operator actions ------------------------------------------------------------------------
@batches_group.command("cancel", short_help="Cancel the batch's jobs not started yet.")
@click.argument("batch_id", type=int, metavar="ID")
@app_option
@pass_state
def cancel_batch(state: State, batch_id: int) -> None:
    """Cancel the batch's jobs that have not started yet.

    Running jobs finish; the batch then closes as cancelled and its on_complete
    task is not called. Exits with status 1, changing nothing, if the batch is
    already closed.
    """
    app = state.app()
    batch = app.get_batch(batch_id)
    if batch.finished:
        raise _already_closed(batch)
    n = batch.cancel()
    after = batch.refresh()
    if n == 0 and after.finished and after.state != BatchState.CANCELLED:
        raise _already_closed(after)  # it closed between our look and the cancel
    running = after.progress()[JobState.RUNNING] if not after.finished else 0
    msg = f"batch {batch_id}: cancelled {n} pending job(s)"
    if running:
        msg += f"; {running} running job(s) will finish, then the batch closes as cancelled"
    elif not after.finished:
        msg += "; the batch closes as cancelled when a worker's flow service next looks"
    click.echo(msg)


def _already_closed(batch: Batch) -> click.ClickException:
    return refuse(
        f"batch {batch.id} is already closed ({batch.state}): there is nothing left to cancel"
    )


@batches_group.command("retry-failed", short_help="Retry the batch's failed jobs; reopen it.")
@click.argument("batch_id", type=int, metavar="ID")
@app_option
@pass_state
def retry_failed(state: State, batch_id: int) -> None:
    """Give every failed job of the batch one more attempt and reopen the batch.

    Its on_complete task is called again when the batch closes again. Exits with
    status 1, changing nothing, if the batch has no failed jobs.
    """
    app = state.app()
    batch = app.get_batch(batch_id)
    n = batch.retry_failed()
    if n == 0:
        raise refuse(f"batch {batch_id} has no failed jobs: nothing to retry")
    click.echo(f"batch {batch_id}: retried {n} failed job(s); the batch is running again")
