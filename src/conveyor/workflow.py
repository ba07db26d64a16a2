"""Workflows: a small graph of task calls, declared, then started in one transaction.

```python
wf = app.workflow("ingest", idempotency_key="req-9")
a = wf.add(fetch.s(url))
b = wf.add(parse.s(), after=[a])           # parse(<a's result>)
m = wf.map(resize.s(), over=b)             # one job per item of b's list result
d = wf.add(store.s(), after=[b, m])        # store([<b's>, [<each resize>, in item order]])
run = wf.start()
```

Nothing here holds the graph while it runs: the flow leader makes each node's
job when its parents have ended (backends/sql/workflows.py), reading what it
needs from the database.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from .checks import MAX_UNIQUE_KEY, check_name
from .errors import ConfigError, ConveyorError, KeyReused
from .records import (
    NodeState,
    WorkflowNode,
    WorkflowNodeSpec,
    WorkflowRecord,
    WorkflowState,
)
from .task import Step, Task

#: ``on_parent_failure``: cancel the node (and so its dependents), run it with a
#: marker in the failed parent's place, or skip it (its dependents get None)
POLICIES = ("fail", "run", "skip")


class WorkflowFailed(ConveyorError):
    """A node's result was asked for, but the node did not succeed."""


class WorkflowApp(Protocol):
    """What workflows call on their app (``Conveyor`` is one)."""

    def start_workflow(
        self,
        name: str,
        nodes: Sequence[WorkflowNodeSpec],
        *,
        idempotency_key: str | None = None,
        fingerprint: str | None = None,
        conn: Any = None,
    ) -> tuple[int, bool]: ...

    def workflow_record(self, workflow_id: int) -> WorkflowRecord: ...

    def workflow_nodes(self, workflow_id: int) -> list[WorkflowNode]: ...

    def workflow_items(self, workflow_id: int, node: int) -> list[WorkflowNode]: ...

    def cancel_workflow(self, workflow_id: int) -> bool: ...

    def retry_workflow(self, workflow_id: int) -> int: ...

    def change_generation(self) -> int: ...

    def wait_for_change(self, generation: int, timeout: float) -> None: ...


@dataclass(frozen=True)
class Node:
    """A declared node: pass it in ``after=`` / ``over=``, or to ``run.result()``."""

    workflow: Workflow = field(repr=False, compare=False)
    index: int
    name: str


class Workflow:
    """A graph being declared (``app.workflow(name)``); ``start()`` writes it."""

    def __init__(self, app: WorkflowApp, name: str, idempotency_key: str | None = None) -> None:
        check_name(name, "name: a workflow's name")
        if idempotency_key is not None:
            check_name(idempotency_key, "idempotency_key", max_length=MAX_UNIQUE_KEY)
        self.app, self.name, self.idempotency_key = app, name, idempotency_key
        self.specs: list[WorkflowNodeSpec] = []
        self._names: set[str] = set()
        self.started: WorkflowRun | None = None

    def add(
        self,
        step: Step | Task,
        *,
        after: Sequence[Node] = (),
        name: str | None = None,
        on_parent_failure: str = "fail",
    ) -> Node:
        """A node running ``step`` once every node in ``after`` has ended. With one
        parent it receives that parent's result as its first argument; with several,
        the list of their results in the order given."""
        step = _as_step(step)
        parents = self._parents(after)
        step.check(receives_result=bool(parents))
        return self._declare(step, "task", parents, None, name, on_parent_failure)

    def map(
        self,
        step: Step | Task,
        *,
        over: Node,
        after: Sequence[Node] = (),
        name: str | None = None,
        on_parent_failure: str = "fail",
    ) -> Node:
        """One job per item of ``over``'s result (a list), each receiving its item
        as the first argument, made when ``over`` succeeds. The node's result is
        the list of the items' results, in item order."""
        step = _as_step(step)
        if on_parent_failure == "run":
            raise ConfigError("on_parent_failure: a map cannot run without its list; 'fail'/'skip'")
        [source] = self._parents([over])
        parents = [source, *(p for p in self._parents(after) if p != source)]
        step.check(receives_result=True)
        return self._declare(step, "map", parents, source, name, on_parent_failure)

    def _parents(self, nodes: Sequence[Node]) -> list[int]:
        if isinstance(nodes, Node):
            nodes = [nodes]
        out = []
        for node in nodes:
            if not isinstance(node, Node) or node.workflow is not self:
                raise ConfigError(f"after: {node!r} is not a node of workflow {self.name!r}")
            if node.index not in out:
                out.append(node.index)
        return out

    def _declare(
        self,
        step: Step,
        kind: str,
        parents: list[int],
        over: int | None,
        name: str | None,
        on_parent_failure: str,
    ) -> Node:
        if self.started is not None:
            raise ConfigError(f"workflow {self.name!r} has started: declare nodes before start()")
        if on_parent_failure not in POLICIES:
            raise ConfigError(
                f"on_parent_failure: one of {', '.join(POLICIES)}, got {on_parent_failure!r}"
            )
        taken = self._names
        if name is None:
            base = step.task.name.rsplit(".", 1)[-1]
            name, n = base, len(self.specs)
            while name in taken:  # a name given earlier may be "base-n" already
                name, n = f"{base}-{n}", n + 1
        elif check_name(name, "name: a node's name") in taken:
            raise ConfigError(f"name: workflow {self.name!r} has a node {name!r} already")
        spec = WorkflowNodeSpec(name, kind, step.to_dict(), tuple(parents), over, on_parent_failure)
        self.specs.append(spec)
        taken.add(name)
        return Node(self, len(self.specs) - 1, name)

    def fingerprint(self) -> str:
        """What was asked for, hashed: a repeat under the idempotency key must match."""
        asked = [self.name, [asdict(s) for s in self.specs]]
        text = json.dumps(asked, sort_keys=True, separators=(",", ":"), default=str)
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def start(self, *, conn: Any = None) -> WorkflowRun:
        """Write the workflow, its nodes and its first jobs in one transaction (in
        ``conn``'s, if given). Under an idempotency key seen before: that run."""
        if not self.specs:
            raise ConfigError(f"workflow {self.name!r} has no nodes: add some before start()")
        if self.started is not None:
            return self.started
        fingerprint = self.fingerprint()
        workflow_id, created = self.app.start_workflow(
            self.name,
            self.specs,
            idempotency_key=self.idempotency_key,
            fingerprint=fingerprint,
            conn=conn,
        )
        run = WorkflowRun(self.app, workflow_id, created)
        if not created:
            record = run.record()
            if record.fingerprint is not None and record.fingerprint != fingerprint:
                made = f"workflow {workflow_id}, {record.name!r}"
                raise KeyReused(self.idempotency_key or "", made)
        self.started = run
        return run


@dataclass(frozen=True)
class WorkflowRun:
    """A started workflow (``wf.start()``, ``app.get_workflow(id)``)."""

    app: WorkflowApp = field(repr=False, compare=False)
    id: int
    created: bool = True

    def record(self) -> WorkflowRecord:
        return self.app.workflow_record(self.id)

    @property
    def state(self) -> WorkflowState:
        return self.record().state

    def nodes(self) -> list[WorkflowNode]:
        """The declared nodes as they stand, in declaration order."""
        return self.app.workflow_nodes(self.id)

    def items(self, node: Node | str | int) -> list[WorkflowNode]:
        """A map node's items as they stand, in item order."""
        return self.app.workflow_items(self.id, self._node(node).node)

    def node(self, node: Node | str | int) -> WorkflowNode:
        return self._node(node)

    def _node(self, node: Node | str | int) -> WorkflowNode:
        nodes = self.nodes()
        for n in nodes:
            if (isinstance(node, Node) and n.node == node.index) or node in (n.name, n.node):
                return n
        names = ", ".join(n.name for n in nodes)
        raise ConfigError(f"workflow {self.id} has no node {node!r}; its nodes: {names}")

    def result(self, node: Node | str | int) -> Any:
        """The node's result; ``WorkflowFailed`` if it did not (or not yet) succeed."""
        n = self._node(node)
        if n.state in (NodeState.SUCCEEDED, NodeState.SKIPPED):
            return n.result
        why = f": {n.error}" if n.error else ""
        raise WorkflowFailed(f"workflow {self.id}: node {n.name!r} is {n.state}{why}")

    def wait(self, timeout: float | None = None) -> WorkflowState:
        """Block until the workflow ends; its final state. ``TimeoutError`` if not
        ended within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            generation = self.app.change_generation()
            record = self.record()
            if record.state != WorkflowState.RUNNING:
                return record.state
            remaining = 3600.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"workflow {self.id} still running after {timeout}s")
            self.app.wait_for_change(generation, min(remaining, 0.5))

    def cancel(self) -> bool:
        """Cancel what has not ended; ``False`` if the run had ended."""
        return self.app.cancel_workflow(self.id)

    def retry(self) -> int:
        """Run the failed, cancelled and skipped nodes again; keep what succeeded."""
        return self.app.retry_workflow(self.id)


def _as_step(step: Step | Task) -> Step:
    if isinstance(step, Task):
        return step.s()
    if isinstance(step, Step):
        return step
    raise ConfigError(f"a workflow node is task.s(...) or a task, got {type(step).__name__}")
