"""``/v1/workflows``: start one from JSON (tasks by name, as ``POST /v1/jobs``
takes them: registered here or run by remote workers), list and read them with
their nodes and a map node's items, cancel, retry, and follow one's nodes as
Server-Sent Events until it ends.

The events: workflow tables carry no change stamps (``/v1/events`` cannot
resume them), so ``/v1/workflows/{id}/events`` re-reads the run's rows when the
database hints at a change (the app's change generation) and at least every
half second, and sends what moved: a ``node`` event when a node's state, job or
items changed (a map node's ``item_counts`` too), a ``workflow`` event when the
run's state changed. It starts with every node and the run as they stand (a
reconnect gets the whole picture again) and ends after the run ends."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import Field

from ... import serialize
from ...app import Conveyor
from ...errors import ConfigError, Conflict, KeyReused, SerializationError
from ...records import WorkflowNode, WorkflowState
from ...task import Step
from ...workflow import Node, Workflow
from ..auth import PRODUCER, READ, requires
from ..dependencies import Ctx, Facade
from ..models import MAX_INT32, JobId, Key, Name, SendOptions, Strict, TaskName, cursor_id
from .events import HEADERS, KEEPALIVE_S, REVOKED, STREAM_DOC, Credential
from .jobs import IdempotencyKey, page

WorkflowPath = Annotated[JobId, Path(description="the workflow's id")]
NodePath = Annotated[
    int, Path(ge=0, le=MAX_INT32, description="the node's index (in declaration order)")
]
#: how often a workflow's event stream re-reads its rows when no change is hinted
EVENTS_POLL_S = 0.5


class NodeCreate(Strict):
    name: Name = Field(description="unique in the workflow; `after` and `map_over` name nodes")
    task: TaskName
    args: list[Any] = Field(default_factory=list, max_length=10_000)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    options: SendOptions | None = Field(None, description="send options of the node's job(s)")
    after: list[Name] = Field(
        default_factory=list,
        max_length=1000,
        description="nodes (declared before this one) it runs after; with one parent it "
        "receives that parent's result first, with several the list of their results",
    )
    map_over: Name | None = Field(
        None,
        description="a map node: one job per item of this node's list result, each "
        "receiving its item first",
    )
    on_parent_failure: Literal["fail", "run", "skip"] = Field(
        "fail",
        description="fail: cancel this node; run: run it with a conveyor_parent_failed "
        "marker in the parent's place; skip: skip it (its dependents get null)",
    )


class WorkflowCreate(Strict):
    name: Name
    idempotency_key: Key | None = Field(
        None,
        description="a retried create returns the first run, a different one under the same "
        "key is refused (or the Idempotency-Key header)",
    )
    nodes: list[NodeCreate] = Field(min_length=1, max_length=10_000)


def _declare(app: Conveyor, body: WorkflowCreate, key: str | None) -> Workflow:
    """The builder, fed node by node: every error names the node's field."""
    wf = app.workflow(body.name, idempotency_key=key)
    declared: dict[str, Node] = {}
    for n, spec in enumerate(body.nodes):
        declared[spec.name] = _node(app, wf, spec, declared, f"nodes[{n}]")
    return wf


def _node(
    app: Conveyor, wf: Workflow, spec: NodeCreate, declared: dict[str, Node], where: str
) -> Node:
    def named(name: str, field: str) -> Node:
        if name not in declared:
            raise ConfigError(f"{where}.{field}: no node {name!r} declared before this one")
        return declared[name]

    after = [named(name, "after") for name in spec.after]
    over = None if spec.map_over is None else named(spec.map_over, "map_over")
    try:
        task = app.plumbing.task_for(spec.task)
        options = {} if spec.options is None else spec.options.options()
        task.template(**options)
        step = Step(task, tuple(spec.args), dict(spec.kwargs), options)
        name, policy = spec.name, spec.on_parent_failure
        if over is None:
            return wf.add(step, after=after, name=name, on_parent_failure=policy)
        return wf.map(step, over=over, after=after, name=name, on_parent_failure=policy)
    except (ConfigError, SerializationError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def view(app: Conveyor, workflow_id: int) -> dict[str, Any]:
    """A run with its nodes (a map node with its items' counts per state)."""
    record = app.plumbing.workflow_record(workflow_id)
    return {
        **serialize.workflow(record),
        "nodes": _nodes(app, app.plumbing.workflow_nodes(record.id)),
    }


def _nodes(app: Conveyor, nodes: list[WorkflowNode]) -> list[dict[str, Any]]:
    return [serialize.workflow_node(n, _counts(app, n)) for n in nodes]


def _counts(app: Conveyor, node: WorkflowNode) -> dict[str, int] | None:
    if node.kind != "map" or node.items is None:
        return None
    return app.plumbing.workflow_item_counts(node.workflow_id, node.node)


router = APIRouter(tags=["workflows"])


@router.post(
    "/workflows",
    status_code=201,
    summary="Start a workflow",
    dependencies=[requires(PRODUCER)],
    responses={200: {"description": "the idempotency key named an existing run"}},
)
def create_workflow(
    body: WorkflowCreate, response: Response, app: Facade, key: IdempotencyKey = None
) -> Any:
    """The run, its nodes and its first jobs, in one transaction. Each node names a
    task (registered in this process or not); ``after`` and ``map_over`` name
    nodes declared before it. ``Idempotency-Key`` (or ``idempotency_key``) makes a
    retried request return the same run with 200, and a different request under a
    key already used a 422."""
    if key is not None and body.idempotency_key not in (None, key):
        raise ConfigError("idempotency_key: differs from the Idempotency-Key header; send one")
    wf = _declare(app, body, key or body.idempotency_key)
    try:
        run = wf.start()
    except KeyReused as exc:
        raise (exc if key is None else exc.named("Idempotency-Key")) from None
    response.status_code = 201 if run.created else 200
    return view(app, run.id)


@router.get("/workflows", summary="List workflows, newest first", dependencies=[requires(READ)])
def list_workflows(
    app: Facade,
    state: WorkflowState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    before_id: Annotated[JobId | None, Query(description="only runs older than this id")] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Any:
    """Runs without their nodes; ``next_cursor`` (or ``before_id``) pages on."""
    before = cursor_id(cursor) if cursor is not None else before_id
    runs = app.list_workflows(state=state, limit=limit, before_id=before)
    return page(
        "workflows", [serialize.workflow(r) for r in runs], limit, runs[-1].id if runs else 0
    )


@router.get(
    "/workflows/{workflow_id}",
    summary="A workflow with its nodes",
    dependencies=[requires(READ)],
)
def get_workflow(workflow_id: WorkflowPath, app: Facade) -> Any:
    return view(app, workflow_id)


@router.get(
    "/workflows/{workflow_id}/nodes/{node}/items",
    summary="A map node's items, in item order",
    dependencies=[requires(READ)],
)
def node_items(workflow_id: WorkflowPath, node: NodePath, app: Facade) -> Any:
    nodes = app.plumbing.workflow_nodes(app.plumbing.workflow_record(workflow_id).id)
    if node >= len(nodes):
        raise ConfigError(f"node: workflow {workflow_id} has nodes 0 to {len(nodes) - 1}")
    items = app.plumbing.workflow_items(workflow_id, node)
    return {"node": _nodes(app, [nodes[node]])[0], "items": _nodes(app, items)}


@router.post(
    "/workflows/{workflow_id}/cancel",
    summary="Cancel what has not ended",
    dependencies=[requires(PRODUCER)],
)
def cancel_workflow(workflow_id: WorkflowPath, app: Facade) -> Any:
    """``cancelled`` is false if the run had ended (nothing changes)."""
    cancelled = app.cancel_workflow(workflow_id)
    return {"cancelled": cancelled, "workflow": view(app, workflow_id)}


@router.post(
    "/workflows/{workflow_id}/retry",
    summary="Run the failed, cancelled and skipped nodes again",
    dependencies=[requires(PRODUCER)],
    responses={409: {"description": "the run is still running"}},
)
def retry_workflow(workflow_id: WorkflowPath, app: Facade) -> Any:
    """What succeeded is kept; a map runs only its items that did not succeed.
    ``retried``: the number of nodes run again. 409 while the run is running."""
    record = app.plumbing.workflow_record(workflow_id)
    if record.state == WorkflowState.RUNNING:
        raise Conflict(f"workflow {record.id} is still running: cancel it or let it end")
    retried = app.retry_workflow(workflow_id)
    return {"retried": retried, "workflow": view(app, workflow_id)}


# -- events --------------------------------------------------------------------------------
async def existing_workflow(workflow_id: WorkflowPath, app: Facade) -> None:
    await asyncio.to_thread(
        app.plumbing.workflow_record, workflow_id
    )  # 404 before the stream starts


def _snapshot(app: Conveyor, workflow_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return serialize.workflow(app.plumbing.workflow_record(workflow_id)), _nodes(
        app, app.plumbing.workflow_nodes(workflow_id)
    )


def _node_key(node: dict[str, Any]) -> tuple[Any, ...]:
    return (node["state"], node["job_id"], node["items"], json.dumps(node.get("item_counts")))


async def workflow_stream(
    app: Conveyor, workflow_id: int, credential: Credential
) -> AsyncIterator[str]:
    """The events of one run: what moved since the last read, until it ends (or
    its token no longer allows it: ``Credential``)."""
    sent: dict[int, tuple[Any, ...]] = {}
    state, seq, quiet_since = None, 0, time.monotonic()
    while True:
        generation = app.plumbing.change_generation()
        record, nodes = await asyncio.to_thread(_snapshot, app, workflow_id)
        out = []
        for node in nodes:
            if sent.get(node["node"]) != _node_key(node):
                sent[node["node"]] = _node_key(node)
                out.append(("node", node))
        if record["state"] != state:
            state = record["state"]
            out.append(("workflow", record))
        if await credential.lapsed(sending=bool(out)):
            yield REVOKED
            return
        for name, data in out:
            seq += 1
            text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
            yield f"id: {workflow_id}-{seq}\nevent: {name}\ndata: {text}\n\n"
        if out:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= KEEPALIVE_S:
            yield ": keep-alive\n\n"
            quiet_since = time.monotonic()
        if state != WorkflowState.RUNNING:
            return
        await asyncio.to_thread(app.plumbing.wait_for_change, generation, EVENTS_POLL_S)


@router.get(
    "/workflows/{workflow_id}/events",
    response_class=StreamingResponse,
    responses=STREAM_DOC,
    dependencies=[requires(READ), Depends(existing_workflow)],
    summary="One workflow's nodes as they change, until it ends",
    description="Starts with every node (event `node`) and the run (event `workflow`) as "
    "they stand, then a `node` event whenever a node's state, job or items change (a map "
    "node carries item_counts, its items per state) and a `workflow` event when the run's "
    "state changes; ends after the run ends. Rows are re-read when the database hints at "
    "a change and every 0.5 s; a reconnect starts with the whole picture again.",
)
def workflow_events(workflow_id: WorkflowPath, request: Request, ctx: Ctx) -> StreamingResponse:
    return StreamingResponse(
        workflow_stream(ctx.conveyor, workflow_id, Credential(ctx, request)),
        media_type="text/event-stream",
        headers=HEADERS,
    )
