"""MkDocs hooks: reference pages made from the code at every build.

- ``reference/openapi.json`` is written from ``conveyor.server.create_app``
  (it is not kept in git), and the ``[OAD(...)]`` tag of ``reference/rest.md``
  renders it, so the REST reference cannot drift from the routes.
- ``<!-- cli-reference -->`` in ``reference/cli.md`` becomes every ``conveyor``
  command's help, usage and options, read from the click group. Click's ``\\b``
  paragraphs (kept as typed in ``--help``) become code blocks here.
"""

from __future__ import annotations

import html
import inspect
import json
import tempfile
from pathlib import Path
from typing import Any

import click

OPENAPI = Path(__file__).parent / "reference" / "openapi.json"
CLI_MARKER = "<!-- cli-reference -->"


def on_config(config: Any) -> Any:
    from conveyor import Conveyor
    from conveyor.server import create_app

    with tempfile.TemporaryDirectory() as tmp:
        # create_app reads nothing from the database; the URL only has to be valid
        app = Conveyor(f"sqlite:///{tmp}/openapi.db")
        document = create_app(app).openapi()
        app.close()
    text = json.dumps(document, indent=2) + "\n"
    if not OPENAPI.exists() or OPENAPI.read_text() != text:
        OPENAPI.write_text(text)  # only when it changed: `mkdocs serve` watches it
    return config


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if CLI_MARKER not in markdown:
        return markdown
    from conveyor.cli.main import cli

    root = click.Context(cli, info_name="conveyor")
    return markdown.replace(CLI_MARKER, "\n".join(_command(root, 2)))


def _command(ctx: click.Context, depth: int) -> list[str]:
    cmd = ctx.command
    path = ctx.command_path
    lines = [f"{'#' * depth} `{path}` {{ #{path.replace(' ', '-')} }}", ""]
    lines += _help(cmd.help or cmd.short_help or "")
    usage = cmd.get_usage(ctx).removeprefix("Usage: ")
    lines += ["```text", usage, "```", ""]
    rows = [
        record
        for p in cmd.get_params(ctx)
        if isinstance(p, click.Option) and not p.hidden
        if (record := p.get_help_record(ctx)) is not None
    ]
    if rows:
        lines += ["| option | what it does |", "|---|---|"]
        lines += [f"| `{_cell(opts)}` | {_cell(text)} |" for opts, text in rows]
        lines.append("")
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                lines += _command(click.Context(sub, info_name=name, parent=ctx), depth + 1)
    return lines


def _help(text: str) -> list[str]:
    """Click's help text as Markdown: a ``\\b`` paragraph is kept line by line."""
    out: list[str] = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        rows = paragraph.splitlines()
        if rows and rows[0].strip() == "\b":
            out += ["```text", *rows[1:], "```", ""]
        elif paragraph.strip():
            out += [html.escape(" ".join(r.strip() for r in rows), quote=False), ""]
    return out


def _cell(text: str) -> str:
    # "[default: 100]" would read as a Markdown reference: escape the brackets
    text = html.escape(" ".join(text.split()), quote=False)
    return text.replace("|", "\\|").replace("[", "\\[").replace("]", "\\]")
