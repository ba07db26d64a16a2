"""``conveyor jobs``: list, show, retry, cancel and delete jobs, by id or by filter."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click
from rich.console import JustifyMethod
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from .. import serialize
from ..app import Conveyor
from ..job import Job
from ..records import Attempt, JobFilter, JobState
from .core import CliError, State, app_option, pass_state, refuse
from .render import (
    STATES,
    attempt_dict,
    cell,
    console,
    echo_json,
    job_dict,
    seconds,
    snippet,
    state_text,
    when,
)

F = TypeVar("F", bound=Callable[..., Any])

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@click.group("jobs")
def jobs_group() -> None:
    """Inspect and operate on jobs, one by id or all that match a filter.

    \b
    conveyor jobs list --state failed --task resize
    conveyor jobs list --search 'a@b.c' --since 2h
    conveyor jobs show 42
    conveyor jobs retry 42
    conveyor jobs retry --state failed --task resize --dry-run
    conveyor jobs cancel --queue emails --yes
    conveyor jobs delete --state cancelled --until 7d
    """


def _when(text: str | None, option: str) -> datetime | None:
    """An ISO time (naive: local time), or a duration ago: 30s, 15m, 2h, 7d."""
    if text is None:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return datetime.now(UTC) - timedelta(seconds=float(m.group(1)) * unit)
    try:
        when_ = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CliError(
            f"{option} {text!r} is not a time: give an ISO time (2026-11-23T10:00) or how "
            "long ago (30s, 15m, 2h, 7d)"
        ) from None
    return when_ if when_.tzinfo else when_.astimezone()


FILTER_OPTIONS = [
    click.option(
        "--state",
        "states",
        multiple=True,
        type=click.Choice(STATES),
        help="Only jobs in this state (repeat for several).",
    ),
    click.option("--queue", "-q", "queues", multiple=True, help="Only jobs on this queue."),
    click.option("--task", "-t", "tasks", multiple=True, help="Only jobs of this task."),
    click.option("--batch", "batch_id", type=int, metavar="ID", help="Only jobs of this batch."),
    click.option("--stage", help="Only jobs at this stage."),
    click.option("--tenant", help="Only jobs of this user or tenant."),
    click.option("--search", metavar="TEXT", help="Only jobs whose arguments contain TEXT."),
    click.option("--since", metavar="WHEN", help="Created at or after WHEN (ISO time or 2h, 7d)."),
    click.option("--until", metavar="WHEN", help="Created before WHEN (ISO time or 2h, 7d)."),
]


def filter_options(fn: F) -> F:
    for option in reversed(FILTER_OPTIONS):
        fn = option(fn)
    return fn


def make_job_filter(**given: Any) -> JobFilter:
    return JobFilter(
        states=given.get("states") or None,
        queues=given.get("queues") or None,
        tasks=given.get("tasks") or None,
        batch_id=given.get("batch_id"),
        stage=given.get("stage"),
        tenant=given.get("tenant"),
        search=given.get("search"),
        created_after=_when(given.get("since"), "--since"),
        created_before=_when(given.get("until"), "--until"),
    )


# -- list ----------------------------------------------------------------------------------
@jobs_group.command("list")
@filter_options
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 10_000),
    default=50,
    show_default=True,
    help="Most jobs to show (newest first).",
)
@click.option(
    "--before", "before_id", type=int, metavar="ID", help="The next page: jobs older than ID."
)
@json_option
@app_option
@pass_state
def list_jobs(
    state: State, /, limit: int, before_id: int | None, as_json: bool, **filters: Any
) -> None:
    """List jobs, newest first. Filters combine; --before pages (the last id shown)."""
    app = state.app()
    if filters.get("batch_id") is not None:
        app.get_batch(filters["batch_id"])  # a missing batch is an error, not "no jobs"
    jobs = app.list_jobs(make_job_filter(**filters), limit=limit, before_id=before_id)
    if as_json:
        echo_json([job_dict(j) for j in jobs])
        return
    if not jobs:
        console().print("no jobs match")
        return
    console().print(jobs_table(jobs))
    if len(jobs) == limit:
        console().print(f"[dim]more: --before {jobs[-1].id}[/]")


def jobs_table(jobs: list[Job]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    columns: list[tuple[str, JustifyMethod]] = [
        ("id", "right"),
        ("task", "left"),
        ("queue", "left"),
        ("state", "left"),
        ("attempts", "right"),
        ("priority", "right"),
        ("created", "left"),
        ("error", "left"),
    ]
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold" if name != "error" else "ellipsis")
    for j in jobs:
        table.add_row(
            cell(j.id),
            cell(j.task),
            cell(j.queue),
            state_text(j.state),
            cell(f"{j.attempts}/{j.max_attempts}"),
            cell(j.priority),
            cell(when(j.created_at)),
            cell(snippet(j.error), "red"),
        )
    return table


# -- show ----------------------------------------------------------------------------------
@jobs_group.command("show")
@click.argument("job_id", type=int, metavar="ID")
@json_option
@app_option
@pass_state
def show_job(state: State, job_id: int, as_json: bool) -> None:
    """Show one job: every field, its result or error, and its attempt log."""
    job = state.app().get_job(job_id)
    attempts = job.attempt_log()
    if as_json:
        echo_json({**job_dict(job), "attempts": [attempt_dict(a) for a in attempts]})
        return
    con = console()
    con.print(job_fields(job))
    if attempts:
        con.print()
        con.print(attempts_table(attempts))
    tb = last_traceback(attempts)
    if tb:
        con.print()
        con.print(Text("last traceback", style="bold"))
        con.print(Text(tb.rstrip(), style="red"))


def job_fields(job: Job) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", justify="right")
    grid.add_column(overflow="fold")
    shown = serialize.job(job)  # sensitive arguments hidden
    rows: list[tuple[str, Any]] = [
        ("job", Text(f"{job.id}", style="bold")),
        ("task", job.task),
        ("queue", job.queue),
        ("state", state_text(job.state)),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("priority", job.priority),
        ("args", json.dumps(shown["args"])),
        ("kwargs", json.dumps(shown["kwargs"])),
        ("unreadable", Text(job.unreadable, style="red") if job.unreadable else None),
        ("created", when(job.created_at)),
        ("due", when(job.scheduled_at)),
        ("started", when(job.started_at)),
        ("finished", when(job.finished_at)),
        ("timeout", seconds(job.timeout) if job.timeout else "none"),
        ("backoff", json.dumps(job.backoff) if job.backoff else "task default"),
        ("unique key", job.unique_key),
        ("idempotency key", job.idempotency_key),
        ("stage", job.stage),
        ("context", None if job.context is None else json.dumps(job.context)),
        ("batch", job.batch_id),
        *chain_rows(job),
    ]
    if job.state == JobState.RUNNING:
        # a finished job keeps the worker that ran it in its lease fields (the
        # attempt log names it): a lease shown there reads as still held
        rows += [("lease owner", job.lease_owner), ("lease expires", when(job.lease_expires_at))]
    if job.result is not None or job.state == JobState.SUCCEEDED:
        rows.append(("result", json.dumps(job.result)))
    rows.append(("error", Text(job.error, style="red") if job.error else None))
    for name, value in rows:
        if value is None or value == "":
            continue  # unset fields are noise
        grid.add_row(name, value if isinstance(value, Text) else cell(value))
    return grid


def chain_rows(job: Job) -> list[tuple[str, Any]]:
    """Where the job stands in its chain, if it is part of one."""
    if job.chain_root is None and job.chain_next is None and not job.chain:
        return []
    root = job.chain_root
    rows: list[tuple[str, Any]] = [
        ("chain", f"started by job {root}" if root else "starts with this job"),
    ]
    if job.chain_next:
        rows.append(("chain next", f"job {job.chain_next}"))
    elif job.chain_next == 0:
        rows.append(("chain next", "none: the chain stopped at this job"))
    elif job.chain and job.state == JobState.SUCCEEDED:
        rows.append(("chain next", "due: a worker's flow service enqueues it next"))
    elif job.chain:
        rows.append(("chain next", "enqueued once this job succeeds"))
    else:
        rows.append(("chain next", "none: this is the last step"))
    if job.chain:
        steps = [str(step.get("task", "?")) for step in job.chain]
        rows.append(("steps after", " -> ".join(steps)))
    return rows


def attempts_table(attempts: list[Attempt]) -> Table:
    table = Table(title="attempts", title_justify="left", show_edge=False, header_style="bold")
    table.add_column("attempt", justify="right")
    table.add_column("stage")
    table.add_column("outcome")
    table.add_column("worker", overflow="fold")
    table.add_column("started")
    table.add_column("duration", justify="right")
    table.add_column("error", overflow="fold")
    for a in attempts:
        style = {
            JobState.SUCCEEDED: "green",
            JobState.FAILED: "red",
            "retry": "yellow",
            "stage": "cyan",
        }.get(a.outcome, "")
        table.add_row(
            cell(a.attempt),
            cell(a.stage),
            cell(a.outcome, style),
            cell(a.worker_id),
            cell(when(a.started_at)),
            cell(seconds(a.duration_s)),
            cell(snippet(a.error, 100), "red"),
        )
    return table


def last_traceback(attempts: list[Attempt]) -> str | None:
    for a in reversed(attempts):
        if a.traceback:
            return a.traceback
    return None


# -- operator actions ------------------------------------------------------------------------
BULK_OPTIONS = [
    click.option("--dry-run", is_flag=True, help="Only count the jobs that match."),
    click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation."),
    click.option("--all", "everything", is_flag=True, help="Act on every job (no filter)."),
]


def bulk_options(fn: F) -> F:
    for option in reversed([*FILTER_OPTIONS, *BULK_OPTIONS]):
        fn = option(fn)
    return fn


def run_bulk(
    state: State,
    action: str,
    ids: tuple[int, ...],
    dry_run: bool,
    yes: bool,
    everything: bool,
    filters: dict[str, Any],
    one: Callable[[Conveyor, int], None],
) -> None:
    """One job by id (each of ``ids``), or every job a filter selects: counted first,
    confirmed, then done in transactions of 500 with a progress bar."""
    app = state.app()
    f = make_job_filter(**filters)
    if ids:
        if not f.empty or everything:
            raise CliError("give job ids, or filters, not both")
        for job_id in ids:
            one(app, job_id)
        return
    if f.empty and not everything:
        raise CliError(
            f"give the id of the job to {action}, or filters (--state, --task, ...) for many; "
            "--all acts on every job"
        )
    bulk = {"retry": app.retry_jobs, "cancel": app.cancel_jobs, "delete": app.delete_jobs}[action]
    counted = bulk(f, dry_run=True)
    noun = f"job{'s' if counted.matched != 1 else ''}"
    click.echo(f"{counted.matched} {noun} to {action} ({f.describe()})")
    if dry_run or not counted.matched:
        return
    if not yes and not click.confirm(f"{action} {counted.matched} {noun}?", default=False):
        raise CliError("nothing done (answer y, or pass --yes)", exit_code=1)
    with Progress(console=console(), transient=True) as progress:
        bar = progress.add_task(action, total=counted.matched)
        result = bulk(f, progress=lambda done: progress.update(bar, completed=done))
    extra = f", {result.requested} running asked to stop" if result.requested else ""
    click.echo(f"{action}: {result.done} done{extra}")


@jobs_group.command("retry")
@click.argument("job_ids", type=int, nargs=-1, metavar="[ID]...")
@bulk_options
@app_option
@pass_state
def retry_job(
    state: State,
    /,
    job_ids: tuple[int, ...],
    dry_run: bool,
    yes: bool,
    everything: bool,
    **filters: Any,
) -> None:
    """Run failed or cancelled jobs again (each gets one more attempt): by id, or
    every one a filter selects. Exits with status 1 if a job given by id is in any
    other state."""
    run_bulk(state, "retry", job_ids, dry_run, yes, everything, filters, _retry_one)


def _retry_one(app: Conveyor, job_id: int) -> None:
    job = app.get_job(job_id)  # a missing id is an error of its own
    if not app.retry_job(job_id):
        raise refuse(
            f"job {job_id} is {app.get_job(job_id).state}: only failed or cancelled jobs "
            "can be retried"
        )
    click.echo(f"job {job_id} ({job.task}) is available again")


@jobs_group.command("cancel")
@click.argument("job_ids", type=int, nargs=-1, metavar="[ID]...")
@bulk_options
@app_option
@pass_state
def cancel_job(
    state: State,
    /,
    job_ids: tuple[int, ...],
    dry_run: bool,
    yes: bool,
    everything: bool,
    **filters: Any,
) -> None:
    """Cancel jobs that have not finished: by id, or every one a filter selects.

    A scheduled or available job is cancelled at once. A running one is flagged:
    its worker cancels it at its next heartbeat. Exits with status 1, changing
    nothing, if a job given by id has already finished.
    """
    run_bulk(state, "cancel", job_ids, dry_run, yes, everything, filters, _cancel_one)


def _cancel_one(app: Conveyor, job_id: int) -> None:
    job = app.get_job(job_id)
    outcome = app.cancel_job(job_id)
    if outcome == "requested":
        click.echo(
            f"job {job_id} ({job.task}) is running: cancellation requested "
            "(its worker cancels it at its next heartbeat)"
        )
        return
    if not outcome:
        now = app.get_job(job_id).state
        if not now.finished:
            raise refuse(f"job {job_id} kept changing state (now {now}): try again")
        raise refuse(f"job {job_id} is {now}: only unfinished jobs can be cancelled")
    click.echo(f"job {job_id} ({job.task}) cancelled")


@jobs_group.command("delete")
@click.argument("job_ids", type=int, nargs=-1, metavar="[ID]...")
@bulk_options
@app_option
@pass_state
def delete_job(
    state: State,
    /,
    job_ids: tuple[int, ...],
    dry_run: bool,
    yes: bool,
    everything: bool,
    **filters: Any,
) -> None:
    """Delete jobs (with their attempt logs) that are not running: by id, or every
    one a filter selects. Exits with status 1 if a job given by id is running."""
    run_bulk(state, "delete", job_ids, dry_run, yes, everything, filters, _delete_one)


def _delete_one(app: Conveyor, job_id: int) -> None:
    job = app.get_job(job_id)
    if not app.delete_job(job_id):
        raise refuse(f"job {job_id} is running: cancel it first, or wait for it to finish")
    click.echo(f"job {job_id} ({job.task}) deleted")
