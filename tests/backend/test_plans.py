"""Query plans of the maintenance queries that run on every pass of the leader:
they go through their partial indexes, never a scan of the job table.

The plans are read without statistics or parameter values: SQLite plans without
ANALYZE, and a prepared statement on PostgreSQL may run its generic plan, where a
parameter (``state = $1``) cannot prove a partial index's predicate.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

# (query, the index its plan must use)
PLANNED = [
    ("job_prune_ids", "conveyor_jobs_finished_idx"),
    ("job_chain_due", "conveyor_jobs_chain_due_idx"),
]


def _sqlite_plan(backend: Any, name: str) -> str:
    class Params(dict[str, Any]):
        def __missing__(self, key: str) -> Any:
            return 1

    with backend._tx() as cur:
        cur.execute("EXPLAIN QUERY PLAN " + backend.Q[name], Params(state="succeeded"))
        return "\n".join(str(r["detail"]) for r in cur.fetchall())


def _pg_plan(backend: Any, name: str) -> str:
    names: list[str] = []

    def positional(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    sql = re.sub(r"%\((\w+)\)s", positional, backend.Q[name])
    with backend._tx() as cur:
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute("SET LOCAL enable_seqscan = off")  # an index that fits is taken
        cur.execute(f"PREPARE conveyor_plan_probe AS {sql}")
        args = ", ".join("NULL" for _ in names)
        cur.execute(f"EXPLAIN EXECUTE conveyor_plan_probe({args})" if names else "")
        plan = "\n".join(str(next(iter(r.values()))) for r in cur.fetchall())
        cur.execute("DEALLOCATE conveyor_plan_probe")
    return plan


@pytest.mark.parametrize(("query", "index"), PLANNED)
def test_maintenance_queries_use_their_partial_index(backend, db_url, query, index):
    if db_url.startswith("mysql"):
        pytest.skip("MySQL has no partial indexes; its own queries use generated columns")
    plan = _sqlite_plan(backend, query) if db_url.startswith("sqlite") else _pg_plan(backend, query)
    assert index in plan, plan
    assert not re.search(r"^(SCAN j|SCAN conveyor_jobs)$", plan, re.M), plan
    assert "Seq Scan on conveyor_jobs" not in plan, plan
