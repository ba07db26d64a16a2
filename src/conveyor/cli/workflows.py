"""``conveyor workflows``: list, show, cancel and retry workflow runs."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table
from rich.text import Text

from .. import serialize
from ..app import Conveyor
from ..records import NodeState, WorkflowNode, WorkflowRecord, WorkflowState
from .core import State, app_option, pass_state, refuse
from .render import cell, console, echo_json, when

WORKFLOW_STATES = [s.value for s in WorkflowState]

STYLES: dict[str, str] = {
    "pending": "cyan",
    "running": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "dim",
    "skipped": "dim",
}

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@click.group("workflows")
def workflows_group() -> None:
    """Inspect and operate on workflows (app.workflow(...).start(), POST /v1/workflows).

    \b
    conveyor workflows list --state failed
    conveyor workflows show 7
    conveyor workflows cancel 7
    conveyor workflows retry 7
    """


def state_text(state: str) -> Text:
    return Text(state, style=STYLES.get(state, ""))


def item_counts(app: Conveyor, node: WorkflowNode) -> dict[str, int] | None:
    """A map node's items per state, once its items are made."""
    if node.kind != "map" or node.items is None:
        return None
    return app.plumbing.workflow_item_counts(node.workflow_id, node.node)


def workflow_json(app: Conveyor, record: WorkflowRecord) -> dict[str, Any]:
    """The run as ``GET /v1/workflows/{id}`` shows it: with its nodes."""
    nodes = app.plumbing.workflow_nodes(record.id)
    shown = [serialize.workflow_node(n, item_counts(app, n)) for n in nodes]
    return {**serialize.workflow(record), "nodes": shown}


@workflows_group.command("list")
@click.option(
    "--state", "state_filter", type=click.Choice(WORKFLOW_STATES), help="Only runs in this state."
)
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 1_000),
    default=50,
    show_default=True,
    help="Most runs to show (newest first).",
)
@json_option
@app_option
@pass_state
def list_workflows(state: State, state_filter: str | None, limit: int, as_json: bool) -> None:
    """List workflow runs, newest first, with their node counts."""
    runs = state.app().list_workflows(state=state_filter, limit=limit)
    if as_json:
        echo_json([serialize.workflow(r) for r in runs])
        return
    if not runs:
        console().print("no workflows match" if state_filter else "no workflows yet")
        return
    table = Table(show_edge=False, header_style="bold")
    for name in ("id", "name", "state", "nodes", "open", "failures", "round", "created"):
        table.add_column(name, overflow="fold")
    for r in runs:
        table.add_row(
            cell(r.id),
            cell(r.name),
            state_text(r.state),
            cell(r.total),
            cell(r.open_nodes),
            cell(r.failures, "red" if r.failures else "dim"),
            cell(r.round),
            cell(when(r.created_at)),
        )
    console().print(table)


@workflows_group.command("show")
@click.argument("workflow_id", type=int, metavar="ID")
@json_option
@app_option
@pass_state
def show_workflow(state: State, workflow_id: int, as_json: bool) -> None:
    """Show one run and its nodes: state, parents, job, a map's items, errors."""
    app = state.app()
    record = app.plumbing.workflow_record(workflow_id)
    if as_json:
        echo_json(workflow_json(app, record))
        return
    con = console()
    title = Text.assemble((f"workflow {record.id} ", "bold"), record.name, " ")
    title.append_text(state_text(record.state))
    con.print(title)
    facts = [
        ("created", when(record.created_at)),
        ("finished", when(record.finished_at)),
        ("idempotency key", record.idempotency_key),
        ("round", str(record.round) if record.round else None),
        ("error", record.error),
    ]
    for name, value in facts:
        if value:
            con.print(Text.assemble((f"{name}: ", "bold"), value))
    con.print(nodes_table(app, app.plumbing.workflow_nodes(record.id)))


def nodes_table(app: Conveyor, nodes: list[WorkflowNode]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for name in ("#", "name", "kind", "task", "after", "state", "job", "items", "error"):
        table.add_column(name, overflow="fold")
    names = {n.node: n.name for n in nodes}
    for n in nodes:
        counts = item_counts(app, n)
        items = "" if counts is None else f"{counts[NodeState.SUCCEEDED]}/{n.items} succeeded"
        table.add_row(
            cell(n.node),
            cell(n.name),
            cell(n.kind),
            cell(n.task),
            cell(", ".join(names[p] for p in n.parents)),
            state_text(n.state),
            cell(n.job_id),
            cell(items),
            cell(n.error, "red"),
        )
    return table


@workflows_group.command("cancel", short_help="Cancel what has not ended.")
@click.argument("workflow_id", type=int, metavar="ID")
@app_option
@pass_state
def cancel_workflow(state: State, workflow_id: int) -> None:
    """Cancel the run's nodes not started and its running nodes' jobs.

    Exits with status 1, changing nothing, if the run has ended.
    """
    app = state.app()
    if not app.cancel_workflow(workflow_id):
        run = app.plumbing.workflow_record(workflow_id)
        raise refuse(f"workflow {workflow_id} has ended ({run.state}): nothing to cancel")
    click.echo(f"workflow {workflow_id}: cancelled; it ends once its running jobs have stopped")


@workflows_group.command("retry", short_help="Run the failed, cancelled and skipped nodes again.")
@click.argument("workflow_id", type=int, metavar="ID")
@app_option
@pass_state
def retry_workflow(state: State, workflow_id: int) -> None:
    """Run a failed or cancelled run's failed, cancelled and skipped nodes again (a
    map: its items that did not succeed); what succeeded is kept.

    Exits with status 1, changing nothing, while the run is running or if it
    succeeded.
    """
    app = state.app()
    run = app.plumbing.workflow_record(workflow_id)
    if run.state == WorkflowState.RUNNING:
        raise refuse(f"workflow {workflow_id} is still running: cancel it or let it end")
    n = app.retry_workflow(workflow_id)
    if n == 0:
        raise refuse(f"workflow {workflow_id} has {run.state}: nothing to retry")
    click.echo(f"workflow {workflow_id}: running {n} node(s) again")
