"""``conveyor worker``: run a worker process until SIGTERM/SIGINT (or, with --burst, dry)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

import click

from ..app import Conveyor
from ..runtime.worker import Worker
from .core import State, app_option, pass_state

LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s"
LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"
LOG_LEVELS = ["debug", "info", "warning", "error"]


@click.command("worker", short_help="Run a worker process that claims and runs jobs.")
@app_option
@click.option(
    "--queues",
    "-Q",
    metavar="Q1,Q2",
    help="Comma-separated queues to take jobs from. [default: every queue your app's tasks use]",
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Jobs run at the same time by this process.",
)
@click.option(
    "--lease",
    "lease_s",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="A claimed job is this worker's for this long unless its heartbeat renews it; "
    "after a crash, other workers take it back once it expires.",
)
@click.option(
    "--grace",
    "grace_s",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="On SIGTERM/SIGINT, how long running jobs may take to finish before they are "
    "released back to the queue. A second signal skips the wait.",
)
@click.option(
    "--burst",
    is_flag=True,
    help="Exit once nothing is claimable and nothing is running (jobs still waiting "
    "for a retry are left to other workers).",
)
@click.option(
    "--tags",
    metavar="T1,T2",
    default="",
    help="Labels jobs can be pinned to (pinned_to=...), besides this worker's id.",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="Lowest level of log lines written to stderr.",
)
@pass_state
def worker(
    state: State,
    queues: str | None,
    concurrency: int,
    lease_s: float,
    grace_s: float,
    burst: bool,
    tags: str,
    log_level: str,
) -> None:
    """Run a worker: claim jobs from the database and run their handlers.

    \b
    conveyor worker --app myapp:app --queues emails,default --concurrency 50

    Stops gracefully on SIGTERM or SIGINT (Ctrl-C): no new jobs are claimed,
    running ones get --grace seconds to finish, the rest go back to the queue
    without using up an attempt. Exit status 0 after a graceful stop.
    """
    app = state.app(need_tasks=True)
    configure_logging(log_level)
    w = Worker(
        app,
        queues=_queues(queues, app),
        concurrency=concurrency,
        lease_s=lease_s,
        grace_s=grace_s,
        burst=burst,
        tags=tags,
    )
    w.run(install_signals=True)
    app.close()
    _exit_if_stuck()


def _queues(option: str | None, app: Conveyor) -> list[str]:
    if option:
        names = [q.strip() for q in option.split(",") if q.strip()]
        if not names:
            raise click.BadParameter("give at least one queue name", param_hint="--queues")
        return names
    used = sorted({t.defaults.queue for t in app.tasks.values()})
    return used or [app.default_queue]


def configure_logging(level: str) -> None:
    # force=True: the app module may already have called basicConfig on import.
    logging.basicConfig(
        level=level.upper(), format=LOG_FORMAT, datefmt=LOG_DATEFMT, stream=sys.stderr, force=True
    )


def _exit_if_stuck(wait_s: float = 3.0) -> None:
    """After a graceful stop, make sure the process really exits.

    Handler threads are daemons, but a non-daemon thread (the worker's database
    threads, or one the user's code started) still stuck in a call would make the
    interpreter wait forever at exit. Give them a moment, then leave without them.
    """
    deadline = time.monotonic() + wait_s
    for t in threading.enumerate():
        if t is threading.current_thread() or t.daemon:
            continue
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [
        t.name
        for t in threading.enumerate()
        if t is not threading.current_thread() and not t.daemon and t.is_alive()
    ]
    if stuck:
        logging.getLogger("conveyor.worker").warning(
            "exiting although thread(s) %s did not finish", ", ".join(stuck)
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
