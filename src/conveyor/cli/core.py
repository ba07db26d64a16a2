"""What every command shares: the error convention, global options, loading ``--app``."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from ..app import Conveyor
from ..backends import sqlite_file
from ..errors import ConveyorError
from ..loading import load_app

F = TypeVar("F", bound=Callable[..., Any])

#: exit status for errors the user can fix (bad URL, bad --app, bad input, missing job)
EXIT_ERROR = 2
#: exit status when an operator action is refused because of the job's state
EXIT_REFUSED = 1


class CliError(click.ClickException):
    """A user-facing failure: one red ``error: ...`` line on stderr, exit status 2."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        # One line whatever the source: a multi-line message would read like a traceback.
        super().__init__(" ".join(str(message).split()))
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it on the class

    def show(self, file: Any = None) -> None:
        click.secho(f"error: {self.format_message()}", fg="red", err=True)


class ConveyorGroup(click.Group):
    """The root group. Its ``invoke`` runs every subcommand, so wrapping it once turns
    any :class:`ConveyorError` into a :class:`CliError` for all commands; its
    ``main`` prints usage errors as one ``error:`` line too (click prints three).

    Subcommands named in ``lazy`` (name -> "module:attribute", relative to this
    package) are imported when first asked for: ``conveyor worker`` starts without
    the dashboard's, the table printers' or the benchmark's imports."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module, _, attr = self.lazy[cmd_name].partition(":")
            command = getattr(importlib.import_module(module, __package__), attr)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, url_first(args, {*self.commands, *self.lazy}))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConveyorError as exc:
            raise CliError(str(exc) or type(exc).__name__) from None

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            click.secho(f"error: {exc.format_message()}{where}", fg="red", err=True)
            sys.exit(EXIT_ERROR)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except (click.Abort, EOFError, KeyboardInterrupt):
            click.secho("error: aborted", fg="red", err=True)
            sys.exit(EXIT_REFUSED)
        sys.exit(rv if isinstance(rv, int) else 0)


#: subcommands with a -d of their own
_OWN_URL = frozenset({"bench"})
_URL_OPTIONS = ("-d", "--database-url")


def url_first(args: list[str], commands: Iterable[str]) -> list[str]:
    """The command line with a ``-d URL`` (``--database-url``) typed after the
    subcommand moved before it, where the root group reads it: ``conveyor
    worker --app myapp:app -d URL`` works as ``--app`` does after the subcommand.
    Not for a subcommand with a ``-d`` of its own, nor past ``--``."""
    names = set(commands)
    at = next((i for i, a in enumerate(args) if a in names), None)
    if at is None or args[at] in _OWN_URL or any(a == "--" for a in args[:at]):
        return args
    moved: list[str] = []
    rest: list[str] = []
    i = at + 1
    while i < len(args):
        a = args[i]
        if a == "--":
            rest.extend(args[i:])
            break
        if a in _URL_OPTIONS and i + 1 < len(args):
            moved += [a, args[i + 1]]
            i += 2
            continue
        if a.startswith("--database-url=") or (a.startswith("-d") and len(a) > 2 and a[2] != "-"):
            moved.append(a)
        else:
            rest.append(a)
        i += 1
    return [*args[:at], *moved, args[at], *rest] if moved else args


@dataclass
class State:
    """Global options, and the app built from them on first use."""

    database_url: str
    #: -d was typed on the command line (then it overrides an --app's own URL)
    url_explicit: bool
    app_spec: str | None = None
    _app: Conveyor | None = None

    def app(
        self, *, need_tasks: bool = False, auto_migrate: bool = False, create: bool = False
    ) -> Conveyor:
        """The Conveyor to use: the ``--app`` one if given, else a bare one on the URL.

        A bare app does not migrate on its own (``auto_migrate=False``): inspecting a
        database that has no schema should say so, not silently create one, nor
        leave an empty SQLite file behind (unless the command makes the schema:
        ``create``).
        """
        if self._app is not None:
            return self._app
        if self.app_spec:
            app = load_app(self.app_spec)
            if self.url_explicit and app.url != self.database_url:
                app.close()  # in case the module already opened its own database
                app.url = self.database_url
        elif need_tasks:
            raise CliError(
                "this command needs the app that registers your tasks: pass "
                "--app module:attribute (e.g. --app myapp:app) or set CONVEYOR_APP"
            )
        else:
            path = sqlite_file(self.database_url)
            if (
                path
                and not (auto_migrate or create)
                and not os.path.exists(path)
                and os.path.isdir(os.path.dirname(os.path.abspath(path)))  # (else: says so)
            ):
                raise CliError(
                    f"no database at {os.path.abspath(path)}: a worker or `conveyor migrate`"
                    " creates it (in another directory? pass -d URL or set"
                    " CONVEYOR_DATABASE_URL)"
                )
            app = Conveyor(self.database_url, auto_migrate=auto_migrate)
        # Release connections when the command ends, even on error.
        click.get_current_context().call_on_close(app.close)
        self._app = app
        return app


def make_state(ctx: click.Context, database_url: str, app_spec: str | None) -> State:
    source = ctx.get_parameter_source("database_url")
    return State(database_url, source == ParameterSource.COMMANDLINE, app_spec)


pass_state = click.make_pass_decorator(State)


def _remember_app(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    state = ctx.find_object(State)
    if value and state is not None:
        state.app_spec = value
    return value


def app_option(fn: F) -> F:
    """``--app`` on a subcommand (it may also be given before the subcommand)."""
    return click.option(
        "--app",
        "app_spec",
        metavar="MODULE:ATTR",
        envvar="CONVEYOR_APP",
        expose_value=False,
        callback=_remember_app,
        help="Your Conveyor app, e.g. myapp:app (the module is imported from the current "
        "directory or sys.path). Its URL is used unless -d is given. [env: CONVEYOR_APP]",
    )(fn)


def wait_for_database_option(fn: F) -> F:
    """``--wait-for-database`` (as ``connect_wait_s``): what ``Conveyor.connect``
    waits at start for a database that does not answer yet."""
    return click.option(
        "--wait-for-database",
        "connect_wait_s",
        type=click.FloatRange(min=0, max=86400),
        default=30.0,
        show_default=True,
        metavar="SECONDS",
        help="At start, keep trying this long to reach a database that does not answer yet "
        "(refused, starting up, restarting), then exit with its error. A wrong password or "
        "database name fails at once. 0: fail at once.",
    )(fn)


def refuse(message: str) -> CliError:
    """An action the job's state does not allow: exit status 1, not a usage error."""
    return CliError(message, exit_code=EXIT_REFUSED)
