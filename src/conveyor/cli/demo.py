"""``conveyor demo``: a few hundred jobs through real worker processes on embedded SQLite."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from ..app import Conveyor
from ..backends import sqlite_file
from ..batch import Batch
from ..records import ACTIVE_STATES, JobState
from .batches import final_line
from .core import CliError
from .render import cell, console, seconds

DEMO_APP = "conveyor.cli.demo_app:app"
#: share of the jobs each demo task gets, in enqueue order
MIX = [("fast", 0.5), ("slow", 0.2), ("flaky", 0.2), ("picky", 0.1)]
#: the demo batch: its jobs, its name, and the task it calls when it closes
BATCH_TASK = "flaky"
BATCH_NAME = "demo-batch"
BATCH_CALLBACK = "batch_done"
#: nothing finishing for this long means something is broken, not slow
STALL_S = 60.0
WORKER_GRACE_S = 5.0


@click.command("demo", short_help="Run a self-contained demo on a throwaway SQLite file.")
@click.option(
    "--jobs",
    "n_jobs",
    type=click.IntRange(1, 100_000),
    default=300,
    show_default=True,
    help="How many jobs to enqueue.",
)
@click.option(
    "--batch-items",
    type=click.IntRange(0, 100_000),
    default=100,
    show_default=True,
    help=f"Items of the demo batch (one {BATCH_TASK} job each, created with task.batch); "
    "0 for no batch.",
)
@click.option(
    "--workers",
    "n_workers",
    type=click.IntRange(1, 32),
    default=2,
    show_default=True,
    help="How many worker processes to start.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1000),
    default=16,
    show_default=True,
    help="Jobs each worker runs at once.",
)
@click.option(
    "--database",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="SQLite file to use. [default: a new file in a fresh temporary folder]",
)
def demo(
    n_jobs: int, batch_items: int, n_workers: int, concurrency: int, db_path: Path | None
) -> None:
    """Watch Conveyor work, with no server: enqueue jobs into an embedded SQLite
    file, run them on worker processes, and summarise what happened.

    The demo tasks (conveyor/cli/demo_app.py) are fast, slow, flaky (retried with
    backoff) and picky (fails permanently for some inputs). Besides those jobs, one
    batch of flaky jobs is created with task.batch(); a worker closes it once all
    its jobs are done and runs its on_complete task. The workers are stopped with
    SIGTERM once nothing is left to run and the batch is closed. Ignores -d and --app.
    """
    con = console()
    path = _database_path(db_path)
    url = f"sqlite:///{path}"
    con.print(Text.assemble("database: ", (str(path), "bold")))

    app = _demo_app(url)
    app.migrate()
    enqueued = enqueue_mix(app, n_jobs)
    con.print(f"enqueued {n_jobs} jobs: " + ", ".join(f"{n} {t}" for t, n in enqueued.items()))
    batch = create_batch(app, batch_items) if batch_items else None
    if batch is not None:
        con.print(
            f"created batch {batch.id} {batch.name!r}: {batch.total} {BATCH_TASK} jobs, "
            f"on_complete={BATCH_CALLBACK}"
        )

    started = time.monotonic()
    with WorkerFleet(url, n_workers, concurrency, path.parent) as fleet:
        con.print(
            f"started {n_workers} worker process(es); their logs: {path.parent / 'worker-*.log'}"
        )
        watch(app, con, fleet, batch)
        stopped = fleet.stop()
    elapsed = time.monotonic() - started
    con.print(
        f"all jobs finished in {elapsed:.1f}s; workers stopped with SIGTERM "
        f"(exit codes: {', '.join(str(c) for c in stopped)})"
    )
    con.print()
    con.print(summary_table(app, n_jobs + batch_items))
    if batch is not None:
        con.print()
        print_batch_summary(con, app, batch.refresh())
    con.print()
    print_next_steps(con, app, url, batch)
    app.close()


def _database_path(db_path: Path | None) -> Path:
    if db_path is None:
        return Path(tempfile.mkdtemp(prefix="conveyor-demo-")) / "demo.db"
    path = db_path.expanduser().resolve()
    if not path.parent.is_dir():
        raise CliError(f"--database: folder {path.parent} does not exist")
    return path


def _demo_app(url: str) -> Conveyor:
    # Worker processes read the URL from the environment when they import the demo app;
    # this process may have imported it already, so point that instance at the URL too.
    os.environ["CONVEYOR_DATABASE_URL"] = url
    from . import demo_app

    demo_app.app.close()
    demo_app.app.url = url
    return demo_app.app


def enqueue_mix(app: Conveyor, n_jobs: int) -> dict[str, int]:
    """Split ``n_jobs`` over the demo tasks (one send_many each); returns task -> count."""
    counts: dict[str, int] = {}
    left = n_jobs
    for i, (name, share) in enumerate(MIX):
        n = left if i == len(MIX) - 1 else min(left, max(1, round(n_jobs * share)))
        left -= n
        if n:
            app.tasks[name].send_many([(k,) for k in range(n)])
            counts[name] = n
    return counts


def create_batch(app: Conveyor, n_items: int) -> Batch:
    """One batch of ``n_items`` flaky jobs, whose on_complete summarises it."""
    task = app.tasks[BATCH_TASK]
    return task.batch(
        [(k,) for k in range(n_items)], name=BATCH_NAME, on_complete=app.tasks[BATCH_CALLBACK]
    )


@dataclass
class WorkerFleet:
    """Worker subprocesses, started like a user would: ``conveyor worker --app ...``."""

    url: str
    count: int
    concurrency: int
    log_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)

    def __enter__(self) -> WorkerFleet:
        env = {**os.environ, "CONVEYOR_DATABASE_URL": self.url}
        cmd = [
            sys.executable,
            "-m",
            "conveyor.cli.main",
            "-d",
            self.url,
            "worker",
            "--app",
            DEMO_APP,
            "--concurrency",
            str(self.concurrency),
            "--grace",
            str(WORKER_GRACE_S),
            "--log-level",
            "info",
        ]
        for i in range(1, self.count + 1):
            log = open(self.log_dir / f"worker-{i}.log", "wb")  # closed in stop()
            self.logs.append(log)
            self.procs.append(
                subprocess.Popen(
                    cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            )
        return self

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def stop(self) -> list[int]:
        """SIGTERM, wait for the graceful stop, SIGKILL whatever is left; exit codes."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=WORKER_GRACE_S + 10))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        for log in self.logs:
            log.close()
        return codes

    def __exit__(self, *exc: object) -> None:
        self.stop()  # on any error or Ctrl-C: never leave workers behind (a no-op if stopped)

    def last_log_line(self) -> str:
        for log in self.logs:
            log.flush()
            lines = Path(log.name).read_text(errors="replace").strip().splitlines()
            if lines:
                return lines[-1]
        return "(no output)"


def watch(app: Conveyor, con: Console, fleet: WorkerFleet, batch: Batch | None = None) -> None:
    """Live progress bars (every job; the batch) until the batch is closed and nothing
    is scheduled, available or running, its on_complete job included."""
    active_states = {s.value for s in ACTIVE_STATES}
    columns = (
        TextColumn("{task.fields[label]:>10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=con, refresh_per_second=4) as progress:
        bar = progress.add_task("starting", total=None, label="all jobs")
        batch_bar = None
        if batch is not None:
            batch_bar = progress.add_task("", total=batch.total, label=f"batch {batch.id}")
        last_done, last_change = -1, time.monotonic()
        while True:
            # The batch first: it closes in the transaction that enqueues its
            # on_complete job, so the counts read next include that job.
            closed = batch is None or _update_batch_bar(progress, batch_bar, batch)
            by_state: Counter[str] = Counter()
            for row in app.counts():
                by_state[row.state] += row.count
            done = (
                by_state[JobState.SUCCEEDED]
                + by_state[JobState.FAILED]
                + by_state[JobState.CANCELLED]
            )
            progress.update(
                bar, completed=done, total=sum(by_state.values()), description=_describe(by_state)
            )
            if closed and not any(by_state[s] for s in active_states):
                return
            if done != last_done:
                last_done, last_change = done, time.monotonic()
            _check_health(fleet, last_change)
            time.sleep(0.25)


def _update_batch_bar(progress: Progress, bar: TaskID | None, batch: Batch) -> bool:
    """Redraw the batch's bar; whether the batch is closed."""
    p = batch.progress()
    done = p[JobState.SUCCEEDED] + p[JobState.FAILED] + p[JobState.CANCELLED]
    closed = p["state"] != JobState.RUNNING
    description = (
        f"[green]{p[JobState.SUCCEEDED]} succeeded[/] [red]{p[JobState.FAILED]} failed[/] "
        f"[yellow]{p[JobState.RUNNING]} running[/] [cyan]{p['pending']} pending[/]"
    )
    if closed:
        description += f" [bold]closed: {p['state']}[/]"
    elif done == p["total"]:
        description += " [dim]closing...[/]"
    if bar is not None:
        progress.update(bar, completed=done, total=p["total"], description=description)
    return bool(closed)


def _describe(c: Counter[str]) -> str:
    return (
        f"[green]{c[JobState.SUCCEEDED]} succeeded[/] [red]{c[JobState.FAILED]} failed[/] "
        f"[yellow]{c[JobState.RUNNING]} running[/] "
        f"[cyan]{c[JobState.SCHEDULED] + c[JobState.AVAILABLE]} pending[/]"
    )


def _check_health(fleet: WorkerFleet, last_change: float) -> None:
    if fleet.alive() == 0:
        raise CliError(
            f"every demo worker exited early; last log line: {fleet.last_log_line()}", exit_code=1
        )
    if time.monotonic() - last_change > STALL_S:
        raise CliError(
            f"no job finished (and no batch closed) for {STALL_S:.0f}s; "
            f"see the worker logs in {fleet.log_dir}",
            exit_code=1,
        )


def summary_table(app: Conveyor, n_read: int) -> Table:
    """Per demo task, its individual jobs (not the batch's: it has its own summary).
    ``n_read``: jobs to read per task, enough to include every one of them."""
    from .demo_app import BEHAVIOUR

    table = Table(title="summary", title_justify="left", show_edge=False, header_style="bold")
    table.add_column("task")
    table.add_column("behaviour", style="dim")
    for name, style in [
        (JobState.SUCCEEDED, "green"),
        (JobState.FAILED, "red"),
        ("retries", "yellow"),
    ]:
        table.add_column(name, justify="right", header_style=f"bold {style}")
    table.add_column("avg run", justify="right")
    for name, _ in MIX:
        # The batch's jobs are newer than these: read past them, then leave them out.
        everything = app.list_jobs(task=name, limit=max(n_read, 1))
        jobs = [j for j in everything if j.batch_id is None]
        states = Counter(j.state.value for j in jobs)
        runs = [
            (j.finished_at - j.started_at).total_seconds()
            for j in jobs
            if j.started_at and j.finished_at
        ]
        table.add_row(
            cell(name),
            cell(BEHAVIOUR[name]),
            cell(states[JobState.SUCCEEDED], "green"),
            cell(states[JobState.FAILED], "red" if states[JobState.FAILED] else ""),
            cell(sum(max(0, j.attempts - 1) for j in jobs)),
            cell(seconds(sum(runs) / len(runs)) if runs else ""),
        )
    return table


def print_batch_summary(con: Console, app: Conveyor, batch: Batch) -> None:
    """The batch's final state and counts, and what its on_complete returned."""
    con.print(Text("batch", style="bold"))
    con.print(Text.assemble("  ", final_line(batch)))
    took = (
        ""
        if batch.record.finished_at is None
        else (
            f" in {seconds((batch.record.finished_at - batch.record.created_at).total_seconds())}"
        )
    )
    con.print(f"  {batch.total} {batch.record.task} jobs, closed{took}")
    callbacks = app.list_jobs(task=BATCH_CALLBACK, limit=10)
    mine = [j for j in callbacks if j.args and j.args[0] == batch.id]
    if mine:
        job = mine[0]
        outcome = (
            repr(job.result) if job.state == JobState.SUCCEEDED else f"{job.state}: {job.error}"
        )
        con.print(f"  on_complete {BATCH_CALLBACK} (job {job.id}) returned {outcome}")


def this_command() -> str:
    """How to run this ``conveyor`` again from here: ``conveyor`` when that is the
    one on the PATH, else its path (``.venv/bin/conveyor`` after ``make demo``)."""
    me = sys.argv[0] if sys.argv else ""
    if os.path.basename(me) != "conveyor":
        return "conveyor"  # (python -m conveyor)
    found = shutil.which("conveyor")
    if found and os.path.realpath(found) == os.path.realpath(me):
        return "conveyor"
    rel = os.path.relpath(me)
    return shlex.quote(rel if not rel.startswith("..") else os.path.abspath(me))


def print_next_steps(con: Console, app: Conveyor, url: str, batch: Batch | None = None) -> None:
    base = f"{this_command()} -d {shlex.quote(url)}"
    failed = [
        j
        for j in app.list_jobs(state=JobState.FAILED, task="flaky", limit=200)
        if j.batch_id is None
    ][:1] or app.list_jobs(state=JobState.FAILED, limit=1)
    con.print("look further:")
    lines = [f"{base} status", f"{base} jobs list --state failed"]
    if failed:
        lines.append(f"{base} jobs show {failed[0].id}")
    if batch is not None:
        lines.append(f"{base} batches show {batch.id}")
        lines.append(f"{base} jobs list --batch {batch.id} --state failed")
    for line in lines:
        con.print(Text("  " + line, style="bold"))
    path = sqlite_file(app.url)
    folder = os.path.dirname(os.path.abspath(path)) if path else ""
    if os.path.basename(folder).startswith("conveyor-demo-"):
        con.print(f"(the database stays in {folder}: rm -r {shlex.quote(folder)} when done)")
