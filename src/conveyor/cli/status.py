"""``conveyor status``: jobs per queue and state, and the workers that are alive."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from .. import serialize
from ..app import Conveyor
from ..batch import Batch
from ..records import BatchState, JobState, QueueInfo, WorkerInfo
from .core import State, app_option, pass_state
from .queues import full_counts
from .render import STATE_STYLES, STATES, cell, console, echo_json, seconds, when


@click.command("status", short_help="Jobs per queue and state, open batches, and the live workers.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@app_option
@pass_state
def status(state: State, as_json: bool) -> None:
    """Show how many jobs each queue holds in each state (with paused queues and
    limits marked), the open batches, and the live workers. With --app, also how
    many periodic schedules the app declares."""
    app = state.app()
    queues = shown_queues(app.queues())
    shapes = [serialize.cli_queue(q) for q in queues]
    n_open, shown = open_batches(app)
    workers = app.workers()
    unserved = app.unserved()
    periodics = len(app.periodics) if state.app_spec else None
    if as_json:
        echo_json(
            {
                "queues": {q["name"]: q["counts"] for q in shapes},
                "queue_settings": {
                    q["name"]: {"paused": q["paused"], "max_running": q["max_running"]}
                    for q in shapes
                },
                "batches": {
                    BatchState.RUNNING: n_open,
                    "shown": [serialize.batch_brief(b.record, p) for b, p in shown],
                },
                "workers": [serialize.cli_worker(w, silent_after_s=STALE_S) for w in workers],
                "unserved": [serialize.count(c) for c in unserved],
                "periodics": periodics,
            }
        )
        return
    con = console()
    con.print(counts_table(queues) if queues else "no jobs yet")
    con.print()
    if n_open:
        con.print(batches_table(n_open, shown))
        con.print()
    con.print(workers_table(workers) if workers else "no workers running")
    if unserved:
        con.print()
        con.print(
            Text("waiting, and no live worker runs them (their queue or task):", style="bold red")
        )
        for c in unserved:
            con.print(f"  {c.count} {c.state} job(s) of task {c.task!r} on queue {c.queue!r}")
    if periodics is not None:
        con.print()
        con.print(
            f"periodic schedules: {periodics}"
            + (f" (conveyor periodic list --app {state.app_spec})" if periodics else "")
        )


def shown_queues(queues: list[QueueInfo]) -> list[QueueInfo]:
    """Queues with jobs, or paused, or limited (a queue whose settings were all undone
    is left out), by name."""
    return sorted(
        (q for q in queues if any(q.counts.values()) or q.paused or q.max_running is not None),
        key=lambda q: q.name,
    )


def counts_table(queues: list[QueueInfo]) -> Table:
    table = Table(title="jobs", title_justify="left", show_edge=False, header_style="bold")
    limits = any(q.max_running is not None for q in queues)
    table.add_column("queue")
    if limits:
        table.add_column("max running", justify="right")
    for name in STATES:
        table.add_column(name, justify="right", header_style=f"bold {STATE_STYLES[name]}")
    totals = dict.fromkeys(STATES, 0)
    for q in queues:
        row = full_counts(q)
        label = Text(q.name)
        if q.paused:
            label.append(" (paused)", style="bold yellow")
        limit = [cell("" if q.max_running is None else q.max_running)] if limits else []
        table.add_row(label, *limit, *(_count(row[s]) for s in STATES))
        for s in STATES:
            totals[s] += row[s]
    if len(queues) > 1:
        table.add_section()
        table.add_row(
            Text("total", style="bold"),
            *([cell("")] if limits else []),
            *(_count(totals[s]) for s in STATES),
        )
    paused = [q.name for q in queues if q.paused]
    if paused:
        table.caption = (
            f"paused: {', '.join(paused)}: workers claim nothing new from "
            f"{'it' if len(paused) == 1 else 'them'} (conveyor queues resume NAME)"
        )
        table.caption_justify = "left"
    return table


def _count(n: int) -> Text:
    return Text(str(n), style="" if n else "dim")


#: open batches listed by name in `conveyor status` (all are counted)
SHOWN_BATCHES = 5
#: counting open batches stops here ("10000+"): status must stay quick
COUNT_BATCHES_UP_TO = 10_000


def open_batches(app: Conveyor) -> tuple[int, list[tuple[Batch, dict[str, Any]]]]:
    """How many batches are running (up to COUNT_BATCHES_UP_TO), and the newest few
    with their progress."""
    page = app.list_batches(state=BatchState.RUNNING, limit=1_000)
    newest = page[:SHOWN_BATCHES]
    n = len(page)
    while len(page) == 1_000 and n < COUNT_BATCHES_UP_TO:
        page = app.list_batches(state=BatchState.RUNNING, limit=1_000, before_id=page[-1].id)
        n += len(page)
    return n, [(b, b.progress()) for b in newest]


def batches_table(n_open: int, shown: list[tuple[Batch, dict[str, Any]]]) -> Table:
    more = "+" if n_open >= COUNT_BATCHES_UP_TO else ""
    title = f"open batches: {n_open}{more}"
    if n_open > len(shown):
        title += f" (newest {len(shown)} shown; conveyor batches list --state running)"
    table = Table(title=title, title_justify="left", show_edge=False, header_style="bold")
    for name in ("id", "name", "task", "done", "percent", "eta"):
        table.add_column(name, justify="right" if name in ("id", "done", "percent") else "left")
    for b, p in shown:
        done = p[JobState.SUCCEEDED] + p[JobState.FAILED] + p[JobState.CANCELLED]
        table.add_row(
            cell(b.id),
            cell(b.name),
            cell(b.record.task),
            cell(f"{done}/{p['total']}"),
            cell(f"{p['percent']}%"),
            cell(seconds(p["eta_s"]) if p["eta_s"] else ""),
        )
    return table


#: Workers heartbeat every lease/3 seconds (10 s by default). One silent for longer
#: than this has most likely died without deregistering (kill -9, lost host).
STALE_S = 60.0


def workers_table(workers: list[WorkerInfo]) -> Table:
    table = Table(title="workers", title_justify="left", show_edge=False, header_style="bold")
    for name in ("id", "queues", "concurrency", "started", "last seen"):
        table.add_column(name, justify="right" if name == "concurrency" else "left")
    for w in workers:
        table.add_row(
            cell(w.id),
            cell(",".join(w.queues)),
            cell(w.concurrency),
            cell(when(w.started_at)),
            last_seen_cell(w),
        )
    stale = sum(is_silent(w) for w in workers)
    if stale:
        table.caption = silent_caption(stale)
        table.caption_justify = "left"
    return table


def last_seen_cell(w: WorkerInfo) -> Text:
    age = _age(w)
    return cell("" if age is None else f"{seconds(age)} ago", "red" if is_silent(w) else "")


def _age(w: WorkerInfo) -> float | None:
    if w.last_seen_at is None:
        return None
    return max(0.0, (datetime.now(UTC) - w.last_seen_at).total_seconds())


def is_silent(w: WorkerInfo) -> bool:
    """Not heard from for over STALE_S: most likely gone without deregistering."""
    age = _age(w)
    return age is not None and age > STALE_S


def silent_caption(n: int) -> str:
    return (
        f"{n} worker(s) silent for over {STALE_S:.0f}s: probably gone without "
        "deregistering (their running jobs come back when their leases expire)"
    )
