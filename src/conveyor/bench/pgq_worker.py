"""PgQueuer's side of ``conveyor bench --pgqueuer``, run as a process of its own by
its path (so it imports PgQueuer and nothing of Conveyor's: its start-up is
PgQueuer's alone), with ``PGQUEUER_PREFIX`` set, so that every PgQueuer object it
touches is the benchmark's own, never a PgQueuer installation of the database's
users. PgQueuer's own API only. Commands (the result is written as JSON to OUT):

- ``fresh DSN OUT``: the benchmark's PgQueuer objects dropped if present, then
  installed: new empty tables, as the peer harness's new database gives them;
- ``enqueue DSN N OUT``: N no-op jobs by ``Queries.enqueue`` in calls of 1,000
  (jobs/s);
- ``enqueue_one DSN N OUT``: N no-op jobs by ``Queries.enqueue``, one job per call
  (jobs/s), as ``conveyor bench`` sends its one-by-one jobs;
- ``drain DSN BATCH OUT``: one PgQueuer worker (uvloop when installed) drains
  them at ``batch_size`` BATCH, noting the first handler start and the last end;
- ``uninstall DSN OUT``: the benchmark's PgQueuer objects dropped.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time
from collections.abc import Awaitable
from typing import Any

ENTRYPOINT = "conveyor_bench_noop"


async def _queries(dsn: str) -> tuple[Any, Any]:
    asyncpg: Any = importlib.import_module("asyncpg")
    pgq: Any = importlib.import_module("pgqueuer")
    conn = await asyncpg.connect(dsn)
    return conn, pgq.Queries.from_asyncpg_connection(conn)


async def fresh(dsn: str) -> dict[str, Any]:
    conn, q = await _queries(dsn)
    try:
        if await q.schema_is_installed():
            await q.uninstall()
        await q.install()
    finally:
        await conn.close()
    return {}


async def uninstall(dsn: str) -> dict[str, Any]:
    conn, q = await _queries(dsn)
    try:
        if await q.schema_is_installed():
            await q.uninstall()
    finally:
        await conn.close()
    return {}


async def enqueue(dsn: str, n: int) -> dict[str, Any]:
    conn, q = await _queries(dsn)
    try:
        payload = b"{}"
        t0 = time.perf_counter()
        for start in range(0, n, 1_000):
            k = min(1_000, n - start)
            await q.enqueue([ENTRYPOINT] * k, [payload] * k, [0] * k)
        return {"jobs_per_s": n / (time.perf_counter() - t0)}
    finally:
        await conn.close()


async def enqueue_one(dsn: str, n: int) -> dict[str, Any]:
    conn, q = await _queries(dsn)
    try:
        payload = b"{}"
        t0 = time.perf_counter()
        for _ in range(n):
            await q.enqueue(ENTRYPOINT, payload, 0)
        return {"jobs_per_s": n / (time.perf_counter() - t0)}
    finally:
        await conn.close()


async def drain(dsn: str, batch_size: int) -> dict[str, Any]:
    asyncpg: Any = importlib.import_module("asyncpg")
    PgQueuer: Any = importlib.import_module("pgqueuer").PgQueuer
    QueueExecutionMode: Any = importlib.import_module("pgqueuer.types").QueueExecutionMode

    notes: dict[str, Any] = {"first": None, "last": None, "count": 0}
    conn = await asyncpg.connect(dsn)
    pgq = PgQueuer.from_asyncpg_connection(conn)

    async def noop(job: Any) -> None:
        now = time.time()
        if notes["first"] is None:
            notes["first"] = now
        notes["last"] = now
        notes["count"] += 1

    pgq.entrypoint(ENTRYPOINT)(noop)
    await pgq.run(batch_size=batch_size, mode=QueueExecutionMode.drain)
    await conn.close()
    return notes


def _work(argv: list[str]) -> Awaitable[dict[str, Any]]:
    command, dsn = argv[1], argv[2]
    if command == "fresh":
        return fresh(dsn)
    if command == "uninstall":
        return uninstall(dsn)
    if command == "enqueue":
        return enqueue(dsn, int(argv[3]))
    if command == "enqueue_one":
        return enqueue_one(dsn, int(argv[3]))
    if command == "drain":
        return drain(dsn, int(argv[3]))
    sys.exit(f"pgq_worker: unknown command {command!r}")


def main() -> None:
    work = _work(sys.argv)
    try:
        run: Any = importlib.import_module("uvloop").run
    except ImportError:
        run = asyncio.run
    result = run(work)
    with open(sys.argv[-1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
