"""``conveyor bench``: measure Conveyor on your own database, as you run it."""

from __future__ import annotations

import json
import os
import tempfile

import click

from ..bench import PHASES, markdown, run
from ..errors import redact_url
from .core import State, pass_state


@click.command("bench", short_help="Measure enqueue, drain, latency and limits on a database.")
@click.option(
    "--jobs",
    "-n",
    type=click.IntRange(min=10),
    default=20_000,
    show_default=True,
    help="Jobs per enqueue and drain phase.",
)
@click.option(
    "--phases",
    default=",".join(PHASES),
    show_default=True,
    help="Comma-separated phases to run.",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Drains per figure (the median is reported, each run listed); the limits "
    "phase alternates limited and unlimited drains this many times.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes per drain, started together (PgQueuer's drains too, with --pgqueuer).",
)
@click.option(
    "--pgqueuer",
    is_flag=True,
    help="Also run PgQueuer (pip install pgqueuer) in the same run, its drains and one-by-one "
    "enqueues alternating with Conveyor's, and print the ratios. PostgreSQL only; its tables "
    "are the benchmark's own (prefixed conveyor_bench_), new for each measurement and dropped "
    "at the end.",
)
@click.option(
    "--database-url",
    "-d",
    "local_url",
    metavar="URL",
    help="The database to measure (also accepted before `bench`, or from "
    "$CONVEYOR_DATABASE_URL). [default: a throwaway SQLite file]",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as one JSON object.")
@pass_state
def bench(
    state: State,
    jobs: int,
    rounds: int,
    workers: int,
    phases: str,
    pgqueuer: bool,
    local_url: str | None,
    as_json: bool,
) -> None:
    """Measure Conveyor on the database given with -d (or $CONVEYOR_DATABASE_URL),
    or on a throwaway SQLite file when none is given.

    \b
    Phases (only the queue `conveyor_bench` is used; its jobs are deleted after each):
      enqueue  enqueue_many of N jobs (1,000 per call), of N in one call, then N/10 one by one
      drain    N no-op jobs run by one `conveyor worker --burst` with its defaults
               (--workers: that many):
               first handler start to last end, and the process's wall time
      latency  200 jobs sent at 50/s to an idle worker: send to handler start
      limits   the drain with a queue limit that never binds, vs unlimited beside it

    \b
    conveyor bench                                   embedded SQLite, in a temp dir
    conveyor bench -d postgresql://me@db:5432/scratch --pgqueuer
    """
    url = local_url or state.database_url
    tmp = None
    if not (local_url or state.url_explicit or os.environ.get("CONVEYOR_DATABASE_URL")):
        tmp = tempfile.TemporaryDirectory(prefix="conveyor-bench-")
        url = f"sqlite:///{tmp.name}/bench.db"
    chosen = tuple(p.strip() for p in phases.split(",") if p.strip())

    def say(message: str) -> None:
        if not as_json:
            click.echo(f"bench: {message}", err=True)

    say(f"database: {redact_url(url)}")
    try:
        report = run(url, jobs, chosen, pgqueuer=pgqueuer, say=say, rounds=rounds, workers=workers)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(markdown(report))
