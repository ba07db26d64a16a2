"""The tasks of bench/bench_workflows.py (``conveyor worker --app workflow_app:app``, in bench/)."""

from __future__ import annotations

import os
from typing import Any

from conveyor import Conveyor

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL"))


@app.task(queue="wf")
async def step(value: Any = None) -> int:
    """A no-op node: an item as it is, its parents' values counted (results stay small)."""
    if isinstance(value, int):
        return value
    return len(value) if isinstance(value, list) else 1


@app.task(queue="wf")
async def numbers(n: int) -> list[int]:
    return list(range(n))


@app.task(queue="wf")
async def total(xs: list[int]) -> int:
    return sum(xs)
