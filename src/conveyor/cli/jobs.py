"""``conveyor jobs``: list, show, retry and cancel jobs."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

from ..app import Conveyor
from ..job import Job
from ..records import Attempt, JobState
from .core import State, app_option, pass_state, refuse
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

#: states a job never leaves on its own (retry is an operator's decision)
FINISHED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@click.group("jobs")
def jobs_group() -> None:
    """Inspect and operate on jobs.

    \b
    conveyor jobs list --state failed
    conveyor jobs list --batch 7
    conveyor jobs show 42
    conveyor jobs retry 42
    conveyor jobs cancel 43
    """


# -- list ----------------------------------------------------------------------------------
@jobs_group.command("list")
@click.option("--state", "state_filter", type=click.Choice(STATES), help="Only jobs in this state.")
@click.option("--queue", "-q", help="Only jobs on this queue.")
@click.option("--task", "-t", help="Only jobs of this task.")
@click.option("--batch", "batch_id", type=int, metavar="ID", help="Only jobs of this batch.")
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 10_000),
    default=50,
    show_default=True,
    help="Most jobs to show (newest first).",
)
@json_option
@app_option
@pass_state
def list_jobs(
    state: State,
    state_filter: str | None,
    queue: str | None,
    task: str | None,
    batch_id: int | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs, newest first."""
    app = state.app()
    if batch_id is None:
        jobs = app.list_jobs(state=state_filter, queue=queue, task=task, limit=limit)
    else:
        jobs = batch_jobs(app, batch_id, state_filter, queue, task, limit)
    if as_json:
        echo_json([job_dict(j) for j in jobs])
        return
    if not jobs:
        console().print("no jobs match")
        return
    console().print(jobs_table(jobs))


def batch_jobs(
    app: Conveyor,
    batch_id: int,
    state_filter: str | None,
    queue: str | None,
    task: str | None,
    limit: int,
) -> list[Job]:
    """The batch's jobs through the same filters, newest first (a missing batch is
    an error; the batch's jobs are read whole and filtered here)."""
    jobs = [
        j
        for j in reversed(app.get_batch(batch_id).jobs())
        if (state_filter is None or j.state == state_filter)
        and (queue is None or j.queue == queue)
        and (task is None or j.task == task)
    ]
    return jobs[:limit]


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
    rows: list[tuple[str, Any]] = [
        ("job", Text(f"{job.id}", style="bold")),
        ("task", job.task),
        ("queue", job.queue),
        ("state", state_text(job.state)),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("priority", job.priority),
        ("args", json.dumps(job.args)),
        ("kwargs", json.dumps(job.kwargs)),
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
        ("lease owner", job.lease_owner),
        ("lease expires", when(job.lease_expires_at)),
    ]
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
@jobs_group.command("retry")
@click.argument("job_id", type=int, metavar="ID")
@app_option
@pass_state
def retry_job(state: State, job_id: int) -> None:
    """Run a failed or cancelled job again (it gets one more attempt).

    Exits with status 1, changing nothing, if the job is in any other state.
    """
    app = state.app()
    job = app.get_job(job_id)  # a missing id is an error of its own
    if not app.retry_job(job_id):
        raise refuse(
            f"job {job_id} is {app.get_job(job_id).state}: only failed or cancelled jobs "
            "can be retried"
        )
    click.echo(f"job {job_id} ({job.task}) is available again")


@jobs_group.command("cancel")
@click.argument("job_id", type=int, metavar="ID")
@app_option
@pass_state
def cancel_job(state: State, job_id: int) -> None:
    """Cancel a job that has not finished.

    A scheduled or available job is cancelled at once. A running one is flagged:
    its worker cancels it at its next heartbeat. Exits with status 1, changing
    nothing, if the job has already finished.
    """
    app = state.app()
    job = app.get_job(job_id)
    outcome: Any = None
    for _ in range(3):
        outcome = app.cancel_job(job_id)
        # None: finished, or moved between the two steps of cancel_job (a running job
        # released back to available at a worker's shutdown): then try again.
        if outcome or app.get_job(job_id).state in FINISHED:
            break
    if outcome == "requested":
        click.echo(
            f"job {job_id} ({job.task}) is running: cancellation requested "
            "(its worker cancels it at its next heartbeat)"
        )
        return
    if not outcome:
        now = app.get_job(job_id).state
        if now not in FINISHED:
            raise refuse(f"job {job_id} kept changing state (now {now}): try again")
        raise refuse(f"job {job_id} is {now}: only unfinished jobs can be cancelled")
    click.echo(f"job {job_id} ({job.task}) cancelled")
