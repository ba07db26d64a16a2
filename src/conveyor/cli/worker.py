"""``conveyor worker``: run a worker process until SIGTERM/SIGINT (or, with --burst, dry)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

import click

from ..app import Conveyor
from ..errors import SchemaTooNew
from ..registry import user_tasks
from ..runtime.worker import EXIT_SCHEMA_TOO_NEW, Worker
from .core import CliError, State, app_option, pass_state, wait_for_database_option

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
    default=100,
    show_default=True,
    help="Jobs run at the same time by this process (coroutines for async handlers, "
    "threads started as needed for sync ones). Lower it for long or heavy jobs.",
)
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Run handlers in N child processes (one job each at a time) instead of in this "
    "one: a crash, exit or memory blow-up fails only that attempt, and a job past its "
    "timeout is really stopped. For CPU-bound or crash-prone handlers. [default: in-process]",
)
@click.option(
    "--max-memory",
    "max_memory_mb",
    type=click.FloatRange(min=1),
    default=None,
    metavar="MB",
    help="With --processes: kill a child whose memory grows past MB (its job fails).",
)
@click.option(
    "--fetch-batch",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Most jobs claimed in one statement: larger is faster for short jobs; 1 "
    "spreads long jobs evenly across workers. [default: --concurrency]",
)
@click.option(
    "--completion-batch",
    type=click.IntRange(min=1),
    default=500,
    show_default=True,
    metavar="N",
    help="Most job outcomes written in one statement.",
)
@click.option(
    "--completion-interval",
    "completion_wait_ms",
    type=click.FloatRange(min=0, max=10_000),
    default=0.0,
    show_default=True,
    metavar="MS",
    help="Wait this long for more outcomes before each write (0: write as soon as the "
    "previous write is done, which already groups outcomes under load).",
)
@click.option(
    "--dead-after",
    "worker_ttl_s",
    type=click.FloatRange(min=0, min_open=True),
    default=7.0,
    show_default=True,
    metavar="SECONDS",
    help="A worker silent this long is dead: its jobs run again elsewhere. It heartbeats "
    "every 2 s (at most a third of this).",
)
@click.option("--lease", "lease_s", type=float, default=None, hidden=True)
@click.option(
    "--resolver",
    type=click.Choice(["registered", "import"]),
    default="registered",
    show_default=True,
    help="registered: run the app's tasks only (and claim only those). import: also run "
    "tasks named module:function, importing them on first use.",
)
@wait_for_database_option
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
    "for a retry are left to other workers). A claim that fails for another reason than "
    "the database being out of reach ends it with exit status 1.",
)
@click.option(
    "--tags",
    metavar="T1,T2",
    default="",
    help="Labels jobs can be pinned to (pinned_to=...), besides this worker's id.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    metavar="PORT",
    help="Serve this worker's Prometheus metrics on http://HOST:PORT/metrics.",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    metavar="HOST",
    help="Address the metrics endpoint listens on.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one object per line, one line per attempt (job id, task, queue, attempt, "
    "outcome, duration, trace id).",
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
    processes: int | None,
    max_memory_mb: float | None,
    fetch_batch: int | None,
    completion_batch: int,
    completion_wait_ms: float,
    worker_ttl_s: float,
    lease_s: float | None,
    resolver: str,
    grace_s: float,
    connect_wait_s: float,
    burst: bool,
    tags: str,
    metrics_port: int | None,
    metrics_host: str,
    log_format: str,
    log_level: str,
) -> None:
    """Run a worker: claim jobs from the database and run their handlers.

    \b
    conveyor worker --app myapp:app --queues emails,default --concurrency 50

    Stops gracefully on SIGTERM or SIGINT (Ctrl-C): no new jobs are claimed,
    running ones get --grace seconds to finish, the rest go back to the queue
    without using up an attempt. Exit status 0 after a graceful stop, 3 when the
    database schema is newer than this code (at start, or while it runs), 1 when a
    --burst worker's claim fails.
    """
    app = state.app(need_tasks=resolver == "registered", create=True)
    configure_logging(log_level, log_format)
    if metrics_port is not None:
        from ..observability.metrics import WorkerMetrics

        metrics = WorkerMetrics()
        try:
            metrics.serve(metrics_port, metrics_host)
        except OSError as exc:
            raise CliError(f"--metrics-port {metrics_port}: cannot listen ({exc})") from None
        app.add_middleware(metrics)
    if max_memory_mb is not None and processes is None:
        raise CliError("--max-memory needs --processes (it kills a child process)")
    if resolver == "registered" and not user_tasks(app.tasks):
        logging.getLogger("conveyor.worker").warning(
            "--app %s registers no tasks (@app.task): this worker can run none of your jobs"
            " (name the module whose functions carry @app.task)",
            state.app_spec,
        )
    w = Worker(
        app,
        queues=_queues(queues, app),
        concurrency=concurrency,
        processes=processes,
        max_memory_mb=max_memory_mb,
        fetch_batch=fetch_batch,
        completion_batch=completion_batch,
        completion_wait_s=completion_wait_ms / 1000,
        worker_ttl_s=lease_s or worker_ttl_s,
        resolver=resolver,
        app_spec=state.app_spec,
        grace_s=grace_s,
        connect_wait_s=connect_wait_s,
        burst=burst,
        tags=tags,
    )
    try:
        w.run(install_signals=True)
    except SchemaTooNew as exc:
        raise CliError(str(exc), exit_code=EXIT_SCHEMA_TOO_NEW) from None
    app.close()
    _exit_if_stuck(w.exit_code)


def _queues(option: str | None, app: Conveyor) -> list[str]:
    if option:
        names = [q.strip() for q in option.split(",") if q.strip()]
        if not names:
            raise click.BadParameter("give at least one queue name", param_hint="--queues")
        return names
    used = sorted({t.defaults.queue for t in user_tasks(app.tasks)})
    return used or [app.default_queue]


def configure_logging(level: str, fmt: str = "text") -> None:
    from ..observability.logs import configure

    configure(level, fmt)


def _exit_if_stuck(code: int = 0, wait_s: float = 3.0) -> None:
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
        os._exit(code)
    if code:
        sys.exit(code)
