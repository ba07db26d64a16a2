"""Workflows on the shared SQL backend: the graph's rows and how they move.

A workflow is its row (``conveyor_workflows``) and one row per declared node
(``item = -1``), plus one per item of a started ``map`` node (``item >= 0``).
A node's job carries the chain marker ``[]`` (a chain with no steps left): the
flow leader finds it through the chain-due index once it has finished, and
``settle`` records its end in one transaction with everything that follows:

- the node ends (a map's item: the map ends when its last item has);
- each child's count of parents still running drops, and a child at 0 is
  decided: cancelled (a parent failed, the default), skipped, or made into its
  job (or a map's items), under an idempotency key per node, item and round, so
  a pass that runs twice (a leadership overlap) makes each job once;
- the workflow ends when no declared node is open.

The workflow row is locked first by every writer (settle, cancel, retry), then
the jobs' rows, then the nodes': one order, so they wait for one another rather
than deadlock. No process keeps graph state between transactions: everything is
read from the rows, results included (a node's result is copied into its row
when it ends, so it outlives the job's retention).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from ...records import (
    PARENT_FAILED,
    ChainLink,
    JobInsert,
    NodeState,
    WorkflowNodeSpec,
    WorkflowState,
    step_job,
)

KeyPair = tuple[str | None, str | None]


class SqlOps(Protocol):
    """What the graph needs of the SQL backend (``SqlBackend`` is one)."""

    Q: dict[str, str]

    def _tx(self, conn: Any = None) -> AbstractContextManager[Any]: ...

    def _q(self, cur: Any, name: str, params: dict[str, Any] | None = None) -> list[Any]: ...

    def _qc(self, cur: Any, name: str, params: dict[str, Any] | None = None) -> int: ...

    def _insert_rows(
        self, cur: Any, jobs: Sequence[JobInsert], now: Any
    ) -> list[tuple[int, KeyPair]]: ...

    def _wake(self, cur: Any, queues: Sequence[str]) -> None: ...

    def _list(self, values: Sequence[Any]) -> Any: ...

    def _now(self, now: datetime | None) -> Any: ...

    def _ts_param(self, value: datetime) -> Any: ...


@dataclass
class _Run:
    id: int
    state: str
    open_nodes: int
    failures: int
    round: int
    error: str | None
    finished_at: Any
    cancelled_at: Any
    dirty: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> _Run:
        return cls(
            id=int(row["id"]),
            state=row["state"],
            open_nodes=int(row["open_nodes"]),
            failures=int(row["failures"]),
            round=int(row["round"]),
            error=row["error"],
            finished_at=row["finished_at"],
            cancelled_at=row["cancelled_at"],
        )

    def params(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "open_nodes": self.open_nodes,
            "failures": self.failures,
            "round": self.round,
            "error": self.error,
            "finished_at": self.finished_at,
            "cancelled_at": self.cancelled_at,
        }


@dataclass
class _Node:
    workflow_id: int
    node: int
    item: int
    name: str
    kind: str
    step: dict[str, Any] | None
    parents: list[int]
    children: list[int]
    over_node: int | None
    on_parent_failure: str
    waiting: int
    state: str
    job_id: int | None = None
    items: int | None = None
    result: str | None = None
    error: str | None = None
    round: int = 0
    finished_at: Any = None
    new: bool = False
    dirty: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> _Node:
        return cls(
            workflow_id=int(row["workflow_id"]),
            node=int(row["node"]),
            item=int(row["item"]),
            name=row["name"],
            kind=row["kind"],
            step=None if row["step"] is None else json.loads(row["step"]),
            parents=json.loads(row["parents"]),
            children=json.loads(row["children"]),
            over_node=row["over_node"],
            on_parent_failure=row["on_parent_failure"],
            waiting=int(row["waiting"]),
            state=row["state"],
            job_id=row["job_id"],
            items=row["items"],
            result=row["result"],
            error=row["error"],
            round=int(row["round"]),
            finished_at=row["finished_at"],
        )

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.workflow_id, self.node, self.item)

    def params(self) -> dict[str, Any]:
        return {
            "workflow_id": self.workflow_id,
            "node": self.node,
            "item": self.item,
            "name": self.name,
            "kind": self.kind,
            "step": None if self.step is None else json.dumps(self.step),
            "parents": json.dumps(self.parents),
            "children": json.dumps(self.children),
            "over_node": self.over_node,
            "on_parent_failure": self.on_parent_failure,
            "waiting": self.waiting,
            "state": self.state,
            "job_id": self.job_id,
            "items": self.items,
            "result": self.result,
            "error": self.error,
            "round": self.round,
            "finished_at": self.finished_at,
        }


#: a node's end as decided: (node, state, result JSON, error)
Ending = tuple[_Node, str, str | None, str | None]

_BAD = (NodeState.FAILED, NodeState.CANCELLED)


def node_insert(step: dict[str, Any], first: list[Any], key: str) -> JobInsert:
    """The job of a node: its step's call with ``first`` before its own arguments."""
    return step_job(step, first)._replace(
        chain_json="[]", chain_root=None, idempotency_key=key, unique_key=None
    )


@dataclass
class Graph:
    """The rows one transaction reads and changes, and the jobs it makes."""

    ops: SqlOps
    cur: Any
    now: Any
    stamp: Any
    runs: dict[int, _Run] = field(default_factory=dict)
    nodes: dict[tuple[int, int, int], _Node] = field(default_factory=dict)
    jobs: list[tuple[_Node, JobInsert]] = field(default_factory=list)

    # -- reading -------------------------------------------------------------------------
    def lock(self, workflow_id: int) -> _Run | None:
        if workflow_id not in self.runs:
            rows = self.ops._q(self.cur, "workflow_lock", {"id": workflow_id})
            if not rows:
                return None
            self.runs[workflow_id] = _Run.from_row(rows[0])
        return self.runs[workflow_id]

    def _keep(self, rows: Sequence[dict[str, Any]]) -> list[_Node]:
        out = []
        for row in rows:
            node = _Node.from_row(row)
            out.append(self.nodes.setdefault(node.key, node))
        return out

    def node(self, workflow_id: int, node: int, item: int = -1) -> _Node:
        key = (workflow_id, node, item)
        if key not in self.nodes:
            params = {"id": workflow_id, "node": node, "item": item}
            rows = self.ops._q(self.cur, "workflow_node_get", params)
            if not rows:
                raise LookupError(f"workflow {workflow_id} has no node {node} item {item}")
            self._keep(rows)
        return self.nodes[key]

    def declared(self, workflow_id: int) -> list[_Node]:
        return self._keep(self.ops._q(self.cur, "workflow_nodes", {"id": workflow_id}))

    def items(self, workflow_id: int, node: int) -> list[_Node]:
        params = {"id": workflow_id, "node": node}
        return self._keep(self.ops._q(self.cur, "workflow_items", params))

    def prefetch(self, nodes: Iterable[_Node]) -> None:
        """Read at once the declared nodes that ``nodes`` ending will touch: their
        children, and the map of each item."""
        wanted: dict[int, set[int]] = {}
        for node in nodes:
            touched = node.children if node.item < 0 else [node.node]
            wanted.setdefault(node.workflow_id, set()).update(touched)
        for workflow_id, numbers in wanted.items():
            missing = sorted(n for n in numbers if (workflow_id, n, -1) not in self.nodes)
            if missing:
                params = {"id": workflow_id, "nodes": self.ops._list(missing)}
                self._keep(self.ops._q(self.cur, "workflow_nodes_in", params))

    def parents(self, node: _Node) -> list[_Node]:
        missing = [p for p in node.parents if (node.workflow_id, p, -1) not in self.nodes]
        if len(missing) > 1:
            params = {"id": node.workflow_id, "nodes": self.ops._list(missing)}
            self._keep(self.ops._q(self.cur, "workflow_nodes_in", params))
        return [self.node(node.workflow_id, p) for p in node.parents]

    # -- deciding ------------------------------------------------------------------------
    def end(self, first: Ending) -> None:
        """``first`` ends, and whatever its end decides, to the end."""
        work = [first]
        while work:
            node, state, result, error = work.pop()
            node.state, node.error, node.dirty = state, error, True
            node.result = result if state == NodeState.SUCCEEDED else None
            node.finished_at = self.stamp
            run = self.runs[node.workflow_id]
            if node.item >= 0:
                owner = self.node(node.workflow_id, node.node)
                owner.waiting -= 1
                owner.dirty = True
                if owner.waiting == 0 and owner.state == NodeState.RUNNING:
                    work.append(self._map_end(owner))
                continue
            run.open_nodes -= 1
            run.dirty = True
            if state in _BAD:
                run.failures += 1
                run.error = run.error or f"{node.name}: {error}"
            for c in node.children:
                child = self.node(node.workflow_id, c)
                if child.state != NodeState.PENDING:
                    continue
                child.waiting -= 1
                child.dirty = True
                if child.waiting == 0:
                    ending = self.ready(child)
                    if ending is not None:
                        work.append(ending)

    def _map_end(self, node: _Node) -> Ending:
        items = self.items(node.workflow_id, node.node)
        bad = [i for i in items if i.state != NodeState.SUCCEEDED]
        if self.runs[node.workflow_id].cancelled_at is not None and bad:
            return node, NodeState.CANCELLED, None, "workflow cancelled"
        if bad:
            first = bad[0]
            why = f"{len(bad)} of {len(items)} items did not succeed (item {first.item}: "
            return node, NodeState.FAILED, None, why + f"{first.state}: {first.error})"
        result = "[" + ",".join(i.result or "null" for i in items) + "]"
        return node, NodeState.SUCCEEDED, result, None

    def ready(self, node: _Node) -> Ending | None:
        """Every parent of ``node`` has ended: its end, or None once its job is made."""
        if self.runs[node.workflow_id].cancelled_at is not None:
            return node, NodeState.CANCELLED, None, "workflow cancelled"
        parents = self.parents(node)
        bad = [p for p in parents if p.state in _BAD]
        if bad and node.on_parent_failure != "run":
            why = f"parent '{bad[0].name}' {bad[0].state}"
            gone = NodeState.SKIPPED if node.on_parent_failure == "skip" else NodeState.CANCELLED
            return node, gone, None, why
        values = [_value(p) for p in parents]
        node.state, node.dirty = NodeState.RUNNING, True
        if node.kind == "map":
            return self._fan_out(node)
        first = [] if not parents else [values[0]] if len(parents) == 1 else [values]
        self.make(node, first)
        return None

    def _fan_out(self, node: _Node) -> Ending | None:
        assert node.over_node is not None
        over = self.node(node.workflow_id, node.over_node)
        seq = _value(over)
        if not isinstance(seq, list):
            what = type(seq).__name__ if seq is not None else "null"
            return node, NodeState.FAILED, None, f"map over '{over.name}': its result is {what}"
        node.items = node.waiting = len(seq)
        if not seq:
            return node, NodeState.SUCCEEDED, "[]", None
        for i, value in enumerate(seq):
            item = _Node(
                workflow_id=node.workflow_id,
                node=node.node,
                item=i,
                name=f"{node.name}[{i}]",
                kind="item",
                step=None,
                parents=[],
                children=[],
                over_node=None,
                on_parent_failure=node.on_parent_failure,
                waiting=0,
                state=NodeState.RUNNING,
                round=node.round,
                new=True,
            )
            self.nodes[item.key] = item
            self.make(item, [value], step=node.step)
        return None

    def make(self, node: _Node, first: list[Any], step: dict[str, Any] | None = None) -> None:
        key = f"conveyor:wf:{node.workflow_id}:{node.node}:{node.item}:{node.round}"
        self.jobs.append((node, node_insert(step or node.step or {}, first, key)))

    # -- writing -------------------------------------------------------------------------
    def flush(self) -> None:
        ops, cur = self.ops, self.cur
        if self.jobs:
            jobs = [ins for _, ins in self.jobs]
            made = {keys[1]: job_id for job_id, keys in ops._insert_rows(cur, jobs, self.now)}
            missing = [i.idempotency_key or "" for i in jobs if i.idempotency_key not in made]
            if missing:  # made by an earlier pass (a leadership overlap): link to those
                params = {"unique_keys": ops._list([]), "idempotency_keys": ops._list(missing)}
                for row in ops._q(cur, "job_find_by_keys", params):
                    made[row["idempotency_key"]] = int(row["id"])
            for node, ins in self.jobs:
                node.job_id, node.dirty = made[ins.idempotency_key], True
            ops._wake(cur, sorted({ins.queue for ins in jobs}))
            self.jobs = []
        inserts = [{**n.params(), "now": self.now} for n in self.nodes.values() if n.new]
        updates = [
            {**n.params(), "now": self.now} for n in self.nodes.values() if n.dirty and not n.new
        ]
        for name, rows in (("workflow_node_insert", inserts), ("workflow_node_update", updates)):
            if rows:  # one round trip where the driver pipelines (psycopg)
                cur.executemany(ops.Q[name], rows)
        for node in self.nodes.values():
            node.new = node.dirty = False
        for run in self.runs.values():
            if run.state == WorkflowState.RUNNING and run.open_nodes == 0:
                run.state = (
                    WorkflowState.CANCELLED
                    if run.cancelled_at is not None
                    else WorkflowState.FAILED
                    if run.failures
                    else WorkflowState.SUCCEEDED
                )
                run.finished_at, run.dirty = self.stamp, True
                ops._wake(cur, ["@done"])
            if run.dirty:
                ops._qc(cur, "workflow_update", {**run.params(), "now": self.now})
                run.dirty = False


def _value(node: _Node) -> Any:
    """What a child receives for ``node``: its result, or the failure marker."""
    if node.state in _BAD:
        return {PARENT_FAILED: {"node": node.name, "state": node.state, "error": node.error}}
    return None if node.result is None else json.loads(node.result)


# -- the operations ----------------------------------------------------------------------
def _graph(ops: SqlOps, cur: Any, now: datetime | None) -> Graph:
    return Graph(ops, cur, ops._now(now), ops._ts_param(now or datetime.now(UTC)))


def create(
    ops: SqlOps,
    *,
    name: str,
    nodes: Sequence[WorkflowNodeSpec],
    idempotency_key: str | None,
    fingerprint: str | None,
    conn: Any,
    now: datetime | None,
) -> tuple[int, bool]:
    children: list[list[int]] = [[] for _ in nodes]
    for i, spec in enumerate(nodes):
        for p in spec.parents:
            children[p].append(i)
    with ops._tx(conn) as cur:
        g = _graph(ops, cur, now)
        params = {
            "name": name,
            "idempotency_key": idempotency_key,
            "fingerprint": fingerprint,
            "total": len(nodes),
            "now": g.now,
        }
        rows = ops._q(cur, "workflow_insert", params)
        if not rows:  # the key named a workflow already: that one, nothing written
            found = ops._q(cur, "workflow_find_by_key", {"idempotency_key": idempotency_key})
            return int(found[0]["id"]), False
        workflow_id = int(rows[0]["id"])
        g.runs[workflow_id] = _Run(
            workflow_id, WorkflowState.RUNNING, len(nodes), 0, 0, None, None, None
        )
        for i, spec in enumerate(nodes):
            node = _Node(
                workflow_id=workflow_id,
                node=i,
                item=-1,
                name=spec.name,
                kind=spec.kind,
                step=spec.step,
                parents=list(spec.parents),
                children=children[i],
                over_node=spec.over_node,
                on_parent_failure=spec.on_parent_failure,
                waiting=len(spec.parents),
                state=NodeState.PENDING,
                new=True,
            )
            g.nodes[node.key] = node
        for node in list(g.nodes.values()):
            if node.waiting == 0:
                ending = g.ready(node)
                if ending is not None:
                    g.end(ending)
        g.flush()
    return workflow_id, True


def settle(ops: SqlOps, cur: Any, links: Sequence[ChainLink], now: datetime | None) -> int:
    """See ``WorkflowStore.workflow_settle``; on the caller's transaction. A few
    statements for the whole pass, whatever its size: the workflows locked, the
    jobs locked, their nodes and those nodes' children read, then the writes."""
    g = _graph(ops, cur, now)
    ids = ops._list(sorted(link.id for link in links))
    owned = ops._q(cur, "workflow_nodes_by_jobs", {"ids": ids})
    for workflow_id in sorted({int(r["workflow_id"]) for r in owned}):
        g.lock(workflow_id)
    jobs = {int(r["id"]): r for r in ops._q(cur, "workflow_jobs_lock", {"ids": ids})}
    owners: dict[int, _Node] = {}
    if owned:  # read again under the locks: a cancel or a retry may have come first
        for node in g._keep(ops._q(cur, "workflow_nodes_by_jobs", {"ids": ids})):
            if node.job_id is not None and node.workflow_id in g.runs:
                owners[node.job_id] = node
        g.prefetch(owners.values())
    closed = []
    for link in sorted(links, key=lambda k: k.id):
        row = jobs.get(link.id)
        if row is None or row["chain_next"] is not None or row["state"] != link.state:
            continue  # advanced already, deleted, or retried since it was read
        owner = owners.get(link.id)
        if owner is not None and owner.state == NodeState.RUNNING:
            g.end((owner, link.state, link.result_json, link.error))
        closed.append(link.id)
    if closed:
        ops._qc(cur, "workflow_jobs_link", {"ids": ops._list(closed)})
    g.flush()
    return len(closed)


def cancel(ops: SqlOps, *, workflow_id: int, now: datetime | None) -> bool:
    with ops._tx() as cur:
        g = _graph(ops, cur, now)
        run = g.lock(workflow_id)
        if run is None or run.state != WorkflowState.RUNNING or run.cancelled_at is not None:
            return False
        run.cancelled_at, run.dirty = g.stamp, True
        for node in g.declared(workflow_id):
            if node.state == NodeState.PENDING:
                g.end((node, NodeState.CANCELLED, None, "workflow cancelled"))
        rows = ops._q(cur, "workflow_running_jobs", {"id": workflow_id})
        ids = ops._list([int(r["job_id"]) for r in rows])
        if rows:
            ops._qc(cur, "workflow_cancel_jobs", {"ids": ids, "now": g.now})
            ops._qc(cur, "job_flag_cancel_ids", {"ids": ids})
            ops._wake(cur, ["@flow", "@done", "@cancel"])
        g.flush()
    return True


def retry(ops: SqlOps, *, workflow_id: int, now: datetime | None) -> int:
    with ops._tx() as cur:
        g = _graph(ops, cur, now)
        run = g.lock(workflow_id)
        if run is None or run.state in (WorkflowState.RUNNING, WorkflowState.SUCCEEDED):
            return 0
        nodes = g.declared(workflow_id)
        again = {n.node for n in nodes if n.state in (*_BAD, NodeState.SKIPPED)}
        run.round += 1
        run.state, run.open_nodes, run.failures = WorkflowState.RUNNING, len(again), 0
        run.dirty = True
        run.error = run.finished_at = run.cancelled_at = None
        ready, endings = [], []
        for node in nodes:
            if node.node not in again:
                continue
            node.round, node.state, node.dirty = run.round, NodeState.PENDING, True
            node.result = node.error = node.finished_at = node.job_id = None
            node.waiting = sum(1 for p in node.parents if p in again)
            if node.kind == "map" and node.waiting == 0 and node.items:
                ending = _retry_items(g, node)
                if ending is not None:
                    endings.append(ending)
                continue
            if node.kind == "map":
                ops._qc(cur, "workflow_items_delete", {"id": workflow_id, "node": node.node})
                gone = [k for k in g.nodes if k[1] == node.node and k[2] >= 0]
                for k in gone:
                    del g.nodes[k]
                node.items = None
            if node.waiting == 0:
                ready.append(node)
        for node in ready:
            ending = g.ready(node)
            if ending is not None:
                endings.append(ending)
        for ending in endings:
            g.end(ending)
        g.flush()
    return len(again)


def _retry_items(g: Graph, node: _Node) -> Ending | None:
    """A map whose parents all still stand: only its items that did not succeed run again."""
    assert node.over_node is not None
    seq = _value(g.node(node.workflow_id, node.over_node))
    redo = [i for i in g.items(node.workflow_id, node.node) if i.state != NodeState.SUCCEEDED]
    node.state, node.waiting = NodeState.RUNNING, len(redo)
    for item in redo:
        item.round, item.state, item.dirty = node.round, NodeState.RUNNING, True
        item.result = item.error = item.finished_at = item.job_id = None
        g.make(item, [seq[item.item]], step=node.step)
    return g._map_end(node) if not redo else None
