"""``conveyor tokens``: API tokens for ``conveyor server`` (create, list, revoke)."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from .. import serialize
from ..app import Conveyor
from ..records import TokenScope
from .core import CliError, State, app_option, pass_state
from .render import cell, console, echo_json, when


def current(app: Conveyor) -> Conveyor:
    version, latest = app.schema_version()
    if version < latest:
        raise CliError(
            f"the database schema is at version {version}, this Conveyor needs {latest}: "
            "run `conveyor migrate` first"
        )
    return app


@click.group("tokens", short_help="Create, list and revoke API tokens for the server.")
def tokens_group() -> None:
    """API tokens for `conveyor server`, sent as `Authorization: Bearer <token>`.

    \b
    conveyor tokens create --scope producer --name billing
    conveyor tokens list
    conveyor tokens revoke 3f9a1c2b7d4e

    Scopes: read (GET only); producer (read, plus create, cancel, retry jobs and
    batches); worker (read, plus lease jobs and report their outcomes, but not
    create, cancel or retry them: neither of producer and worker includes the
    other); admin (everything). Only a SHA-256 of each secret is stored: a token
    is shown once, when it is created.
    """


@tokens_group.command("create")
@click.option(
    "--scope",
    type=click.Choice([s.value for s in TokenScope]),
    required=True,
    help="What the token may do: read < producer, read < worker, admin = all "
    "(producer and worker are separate; see `conveyor tokens --help`).",
)
@click.option("--name", metavar="TEXT", help="A label, to tell tokens apart in lists.")
@app_option
@pass_state
def create(state: State, scope: str, name: str | None) -> None:
    """Create a token and print it (once: it cannot be shown again)."""
    app = state.app(auto_migrate=True)
    token, secret = app.create_token(scope, name=name)
    click.echo(secret)
    click.echo(f"token {token.id} ({token.scope}) created; store it now, it is not kept", err=True)


@tokens_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@app_option
@pass_state
def list_tokens(state: State, as_json: bool) -> None:
    """Every token: id, name, scope, when created and revoked (never secrets)."""
    tokens = current(state.app()).tokens()
    if as_json:
        echo_json([serialize.token(t) for t in tokens])
        return
    if not tokens:
        console().print(
            "no API tokens: `conveyor server` serves loopback clients only, unauthenticated"
        )
        return
    table = Table(show_edge=False, header_style="bold")
    for column in ("id", "name", "scope", "created", "status"):
        table.add_column(column, overflow="fold")
    for t in tokens:
        status = (
            Text("active", style="green")
            if t.active
            else Text(f"revoked {when(t.revoked_at)}", style="dim")
        )
        table.add_row(cell(t.id), cell(t.name), cell(t.scope), cell(when(t.created_at)), status)
    console().print(table)


@tokens_group.command("revoke")
@click.argument("token_id", metavar="ID")
@app_option
@pass_state
def revoke(state: State, token_id: str) -> None:
    """Revoke token ID: servers refuse it within a few seconds. Revoking the last
    active token does not open the server again: it stays closed (every request
    gets 401) until a token is created, or it is restarted with `--open`."""
    app = current(state.app())
    if not app.revoke_token(token_id):
        raise CliError(f"no active token with id {token_id!r} (see `conveyor tokens list`)")
    click.echo(f"token {token_id} revoked")
    if not app.serving.tokens_active():
        click.echo(
            "that was the last active token: servers on this database now refuse every "
            "request (401) until you create one; `conveyor server --open` serves loopback "
            "clients without a token again",
            err=True,
        )
