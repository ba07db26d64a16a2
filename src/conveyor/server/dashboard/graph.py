"""Where the workflow page draws each node and edge: layers by depth (a node sits
one layer below its deepest parent), top to bottom; within a layer, nodes are
ordered by where their parents sit (fewer crossings), then as declared. Pure
arithmetic on the serialised nodes: the template turns it into SVG."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BOX_W, BOX_H = 236, 64
GAP_X, GAP_Y = 28, 56
PAD = 14
#: a graph with more nodes is not drawn (the page lists the nodes instead)
MOST_DRAWN = 300


@dataclass(frozen=True)
class Box:
    node: dict[str, Any]
    x: float
    y: float

    @property
    def status(self) -> str:
        return status_text(self.node)

    @property
    def done_w(self) -> float:
        """A map node's bar: the width its succeeded items fill."""
        return _bar(self.node, "succeeded")

    @property
    def failed_w(self) -> float:
        return _bar(self.node, "failed")


@dataclass(frozen=True)
class Edge:
    parent: int
    child: int
    path: str
    over: bool  # the list a map fans out over


@dataclass(frozen=True)
class Layout:
    boxes: list[Box]
    edges: list[Edge]
    width: float
    height: float


def status_text(node: dict[str, Any]) -> str:
    """``running``, or for a map with items ``running · 997/1000 succeeded``."""
    counts = node.get("item_counts")
    if not counts or node.get("items") is None:
        return str(node["state"])
    text = f"{node['state']} · {counts.get('succeeded', 0)}/{node['items']} succeeded"
    failed = counts.get("failed", 0)
    return text + (f", {failed} failed" if failed else "")


def _bar(node: dict[str, Any], state: str) -> float:
    counts, items = node.get("item_counts"), node.get("items")
    if not counts or not items:
        return 0.0
    return round((BOX_W - 20) * int(counts.get(state, 0)) / int(items), 1)


def layers(nodes: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The nodes by depth (parents are declared before their children)."""
    depth: dict[int, int] = {}
    for n in nodes:
        depth[n["node"]] = 1 + max((depth[p] for p in n["parents"]), default=-1)
    out: list[list[dict[str, Any]]] = [[] for _ in range(1 + max(depth.values(), default=-1))]
    place: dict[int, float] = {}
    for n in nodes:
        out[depth[n["node"]]].append(n)
    for layer in out:
        # a node under its parents: sort by their mean position (stable: as declared)
        layer.sort(key=lambda n: _mean([place[p] for p in n["parents"]]))
        for i, n in enumerate(layer):
            place[n["node"]] = i - (len(layer) - 1) / 2
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def layout(nodes: list[dict[str, Any]]) -> Layout:
    rows = layers(nodes)
    widest = max((len(r) for r in rows), default=0)
    width = 2 * PAD + widest * BOX_W + max(0, widest - 1) * GAP_X
    at: dict[int, Box] = {}
    for depth, row in enumerate(rows):
        row_w = len(row) * BOX_W + max(0, len(row) - 1) * GAP_X
        left = (width - row_w) / 2
        for i, n in enumerate(row):
            at[n["node"]] = Box(n, left + i * (BOX_W + GAP_X), PAD + depth * (BOX_H + GAP_Y))
    edges = []
    for n in nodes:
        child = at[n["node"]]
        for p in n["parents"]:
            edges.append(_edge(at[p], child, over=p == n.get("over_node")))
    height = 2 * PAD + len(rows) * BOX_H + max(0, len(rows) - 1) * GAP_Y
    return Layout([at[n["node"]] for n in nodes], edges, width, height)


def _edge(parent: Box, child: Box, *, over: bool) -> Edge:
    """A curve from the bottom of the parent to the top of the child (the arrow
    head ends a few pixels above the box)."""
    x1, y1 = parent.x + BOX_W / 2, parent.y + BOX_H
    x2, y2 = child.x + BOX_W / 2, child.y - 4
    bend = GAP_Y / 2
    path = (
        f"M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}"
    )
    return Edge(parent.node["node"], child.node["node"], path, over)
