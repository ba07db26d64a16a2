"""PgQueuer in the same run as ``conveyor bench --pgqueuer`` (its own API only):
bulk enqueue of N no-op jobs, then their drain by one PgQueuer worker process at
batch 100 (as many times as ``--rounds``) and at its default batch 10. PgQueuer's
tables are installed in the database when missing, and its queue is emptied
before and after."""

from __future__ import annotations

import asyncio
import importlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError

ENTRYPOINT = "conveyor_bench_noop"


def _dsn(url: str) -> str:
    return "postgresql://" + url.split("://", 1)[1]


async def _enqueue(dsn: str, n: int, install: bool) -> float:
    asyncpg: Any = importlib.import_module("asyncpg")
    pgq: Any = importlib.import_module("pgqueuer")
    db: Any = importlib.import_module("pgqueuer.db")
    conn = await asyncpg.connect(dsn)
    try:
        q = pgq.Queries(db.AsyncpgDriver(conn))
        if install and not await q.has_table("pgqueuer"):
            await q.install()
        await q.clear_queue(ENTRYPOINT)
        payload = b"{}"
        t0 = time.perf_counter()
        for start in range(0, n, 1_000):
            k = min(1_000, n - start)
            await q.enqueue([ENTRYPOINT] * k, [payload] * k, [0] * k)
        return n / (time.perf_counter() - t0)
    finally:
        await conn.close()


def _drain(dsn: str, n: int, batch: int, tmp: Path) -> int:
    out = tmp / f"pgq-{batch}-{time.monotonic_ns()}.json"
    code = subprocess.call(
        [sys.executable, "-m", "conveyor.bench.pgq_worker", dsn, str(batch), str(out)]
    )
    if code != 0:
        raise RuntimeError(f"the PgQueuer worker exited with status {code}")
    notes = json.loads(out.read_text())
    if notes["count"] != n:
        raise RuntimeError(f"the PgQueuer worker ran {notes['count']} of {n} jobs")
    return round(n / max(float(notes["last"]) - float(notes["first"]), 1e-9))


def check() -> Any:
    """The pgqueuer module, or a ConfigError saying what to install."""
    try:
        importlib.import_module("asyncpg")
        return importlib.import_module("pgqueuer")
    except ImportError as exc:
        raise ConfigError(
            f"--pgqueuer: {exc.name or 'PgQueuer'} is not installed"
            " (pip install 'conveyor[bench]', or pip install pgqueuer asyncpg)"
        ) from None


def run(url: str, n: int, tmp: Path, say: Callable[[str], None], rounds: int = 1) -> dict[str, Any]:
    """PgQueuer's bulk enqueue, its drain at batch 100 ``rounds`` times (the median
    and each run) and at batch 10 once."""
    pgqueuer = check()
    dsn = _dsn(url)
    result: dict[str, Any] = {"version": pgqueuer.__version__}
    say(f"pgqueuer: {n:,} jobs by Queries.enqueue, calls of 1,000")
    result["bulk_jobs_per_s"] = round(asyncio.run(_enqueue(dsn, n, install=True)))
    runs = []
    for r in range(rounds):
        say(f"pgqueuer: drain of {n:,} no-op jobs, one worker, batch_size=100 ({r + 1}/{rounds})")
        if r:
            asyncio.run(_enqueue(dsn, n, install=False))
        runs.append(_drain(dsn, n, 100, tmp))
    result["drain_batch100"] = round(statistics.median(runs))
    result["drain_batch100_runs"] = runs
    say(f"pgqueuer: drain of {n:,} no-op jobs, one worker, batch_size=10")
    asyncio.run(_enqueue(dsn, n, install=False))
    result["drain_batch10"] = _drain(dsn, n, 10, tmp)
    return result
