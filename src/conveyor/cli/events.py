"""``conveyor events emit``: wake the jobs waiting for an event (durable waits)."""

from __future__ import annotations

import json
from typing import Any

import click

from .core import CliError, State, app_option, pass_state
from .render import echo_json


@click.group("events", short_help="Emit events that durable waits wake on.")
def events_group() -> None:
    """Events that handlers wait for with ``current_job().wait_for_event(key)``.

    \b
    conveyor events emit paid:42 --payload '{"amount": 30}'
    """


@events_group.command("emit")
@click.argument("key")
@click.option("--payload", default=None, help="The event's payload, as JSON (default: null).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a sentence.")
@app_option
@pass_state
def emit(state: State, key: str, payload: str | None, as_json: bool) -> None:
    """Emit event KEY: jobs waiting for it run again now, and a wait that comes
    later returns at once. The first payload for a key wins: emitting it again
    changes nothing (and says so)."""
    value: Any = None
    if payload is not None:
        try:
            value = json.loads(payload)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise CliError(f"--payload is not valid JSON: {exc}") from None
    emitted = state.app().emit_event(key, value)
    if as_json:
        echo_json({"key": emitted.key, "created": emitted.created, "woken": emitted.woken})
    elif emitted.created:
        click.echo(f"event {key!r} emitted; {emitted.woken} waiting job(s) woken")
    else:
        click.echo(f"event {key!r} was emitted before: its first payload stands, nothing changed")
