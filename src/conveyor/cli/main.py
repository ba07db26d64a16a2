"""The ``conveyor`` command: the root group, ``migrate`` and ``enqueue``."""

from __future__ import annotations

import json
from typing import Any

import click

from ..app import DEFAULT_URL
from ..registry import user_tasks
from ..task import SEND_OPTIONS
from .core import CliError, ConveyorGroup, State, app_option, make_state, pass_state

#: the subcommands, imported when run (or listed by --help): name -> module:attribute
COMMANDS = {
    "worker": ".worker:worker",
    "status": ".status:status",
    "jobs": ".jobs:jobs_group",
    "batches": ".batches:batches_group",
    "workflows": ".workflows:workflows_group",
    "queues": ".queues:queues_group",
    "workers": ".workers:workers_group",
    "prune": ".prune:prune",
    "periodic": ".periodic:periodic_group",
    "demo": ".demo:demo",
    "server": ".server:server",
    "dashboard": ".server:dashboard",
    "tokens": ".tokens:tokens_group",
    "tasks": ".tasks:tasks_group",
    "bench": ".bench:bench",
    "events": ".events:events_group",
}


@click.group(
    cls=ConveyorGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--database-url",
    "-d",
    envvar="CONVEYOR_DATABASE_URL",
    default=DEFAULT_URL,
    show_default=True,
    metavar="URL",
    help="sqlite:///path/to/file.db, postgresql://user@host:5432/dbname or "
    "mysql://user:pass@host:3306/dbname. "
    "[env: CONVEYOR_DATABASE_URL]",
)
@click.option(
    "--app",
    "app_spec",
    metavar="MODULE:ATTR",
    envvar="CONVEYOR_APP",
    help="Your Conveyor app, e.g. myapp:app; its URL is used unless -d is given. "
    "Commands that run or enqueue tasks need it. [env: CONVEYOR_APP]",
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=lambda ctx, _param, value: _print_version(ctx, value),
    help="Show the version and exit.",
)
@click.pass_context
def cli(ctx: click.Context, database_url: str, app_spec: str | None) -> None:
    """Conveyor: a durable task queue whose only infrastructure is a database.

    \b
    conveyor migrate                         create or upgrade the schema
    conveyor worker --app myapp:app          run a worker
    conveyor enqueue send_email --app myapp:app --args '["a@b.c", "hi"]'
    conveyor status                          jobs per queue and state, live workers
    conveyor jobs list --state failed        inspect, retry and cancel jobs
    conveyor batches show 7 --follow         watch a batch until it closes
    conveyor workflows show 7                a workflow's nodes, their states and results
    conveyor queues pause emails             pause, resume and limit queues
    conveyor workers stop ID                 list workers, stop one remotely
    conveyor prune --dry-run                 apply retention to finished jobs now
    conveyor periodic list --app myapp:app   cron schedules and their next ticks
    conveyor server --app myapp:app          the HTTP API (REST, remote workers, asyncflow)
    conveyor dashboard --app myapp:app       the web dashboard (the server, at /)
    conveyor tokens create --scope admin     API tokens for the server
    conveyor tasks settings set resize ...   per-task-type settings, no redeploy
    conveyor demo                            see it all work on a throwaway SQLite file
    conveyor bench -d URL                    measure enqueue, drain and latency there

    Errors print one `error: ...` line and exit with status 2.
    """
    ctx.obj = make_state(ctx, database_url, app_spec)


@cli.command("migrate", short_help="Create or upgrade the database schema.")
@app_option
@pass_state
def migrate(state: State) -> None:
    """Create the Conveyor tables, or upgrade them to this version's schema.

    Safe to run from several places at once; workers also migrate on start.
    """
    app = state.app(create=True)
    applied = app.migrate()
    version, _latest = app.schema_version()
    if applied:
        listed = ", ".join(str(v) for v in applied)
        click.echo(f"applied migration(s) {listed}: schema now at version {version}")
    else:
        click.echo(f"schema up to date (version {version})")


@cli.command("enqueue")
@click.argument("task")
@app_option
@click.option(
    "--args",
    "args_json",
    default="[]",
    metavar="JSON",
    help="Positional arguments as a JSON array, e.g. '[1, \"two\"]'.",
)
@click.option(
    "--kwargs",
    "kwargs_json",
    default="{}",
    metavar="JSON",
    help='Keyword arguments as a JSON object, e.g. \'{"to": "a@b.c"}\'.',
)
@click.option("--queue", "-q", help="Queue to put the job on. [default: the task's]")
@click.option("--priority", "-p", type=int, help="Higher runs first. [default: the task's]")
@click.option(
    "--delay",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Run no sooner than this many seconds from now.",
)
@click.option(
    "--unique-key",
    metavar="KEY",
    help="Skip enqueueing while an unfinished job holds this key (prints its id).",
)
@click.option(
    "--idempotency-key",
    metavar="KEY",
    help="Enqueue at most once for this key, ever (prints the first job's id).",
)
@click.option("--max-attempts", type=click.IntRange(min=1), help="[default: the task's]")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Longest one attempt may run. [default: the task's]",
)
@click.option("--tenant", metavar="ID", help="The user or tenant the job is for (a filter later).")
@click.option(
    "--remote",
    is_flag=True,
    help="TASK has no handler in --app (another app's or a remote worker's): enqueue it "
    "by name with default options.",
)
@pass_state
def enqueue(
    state: State, /, task: str, args_json: str, kwargs_json: str, remote: bool, **options: Any
) -> None:
    """Enqueue one job of TASK and print its id.

    \b
    conveyor enqueue send_email --app myapp:app --args '["a@b.c", "hi"]' --delay 60
    conveyor enqueue resize --args '["a.png"]' --queue images    (no --app: by name)

    With --app, TASK must be one of its tasks (its arguments are checked against
    the handler) unless --remote says it runs elsewhere.
    """
    args = _json_arg(args_json, "--args", list, "a JSON array, e.g. '[1, 2]'")
    kwargs = _json_arg(kwargs_json, "--kwargs", dict, "a JSON object, e.g. '{\"x\": 1}'")
    clash = sorted(set(kwargs) & SEND_OPTIONS)
    if clash:
        # Task.send would read these as job options, not handler arguments.
        raise CliError(
            f"--kwargs cannot contain {clash}: those names are job options; "
            "use the matching command-line options instead"
        )
    app = state.app()
    if state.app_spec and task not in app.tasks and not remote:
        known = ", ".join(sorted(t.name for t in user_tasks(app.tasks))) or "none"
        raise CliError(
            f"unknown task {task!r}; tasks registered on {state.app_spec}: {known} "
            "(--remote enqueues a task that has no handler in this app)"
        )
    try:
        job = app.enqueue(task, args, kwargs, **{k: v for k, v in options.items() if v is not None})
    except TypeError as exc:  # arguments that do not fit the handler's signature
        raise CliError(str(exc)) from None
    click.echo(job.id)


def _print_version(ctx: click.Context, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from .. import __version__  # read from the package's metadata only when asked

    click.echo(f"conveyor, version {__version__}")
    ctx.exit()


def _json_arg(text: str, option: str, kind: type, expected: str) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{option} is not valid JSON ({exc}): expected {expected}") from None
    except RecursionError:
        raise CliError(f"{option} is nested too deeply to read: expected {expected}") from None
    if not isinstance(value, kind):
        raise CliError(f"{option} must be {expected}, got {type(value).__name__}")
    return value


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="conveyor")


if __name__ == "__main__":
    main()
