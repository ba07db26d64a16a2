"""A PgQueuer worker for ``conveyor bench --pgqueuer`` (run as its own process):
drains the no-op jobs ``conveyor bench`` enqueued, noting the first start and the
last end, and writes them as JSON to the file given. PgQueuer's own API only."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time
from typing import Any


async def drain(dsn: str, batch_size: int, out: str) -> None:
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

    pgq.entrypoint("conveyor_bench_noop")(noop)

    await pgq.run(batch_size=batch_size, mode=QueueExecutionMode.drain)
    await conn.close()
    with open(out, "w") as f:
        json.dump(notes, f)


def main() -> None:
    dsn, batch_size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    try:
        uvloop: Any = importlib.import_module("uvloop")
        uvloop.run(drain(dsn, batch_size, out))
    except ImportError:
        asyncio.run(drain(dsn, batch_size, out))


if __name__ == "__main__":
    main()
