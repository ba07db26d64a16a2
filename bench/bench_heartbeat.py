"""Rows written per second to keep running jobs alive, per worker, at concurrency 100.

One worker process runs 100 jobs that each sleep for two minutes; over a 30 s
window of that steady state (no claim, no completion), the rows PostgreSQL
counts as updated or inserted in conveyor_jobs and conveyor_workers are the
heartbeat's writes. Runs with whichever conveyor is importable, so the same
script measures an older checkout: PYTHONPATH=/path/to/old/src python bench/bench_heartbeat.py

    .venv/bin/python bench/bench_heartbeat.py [--window 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time

import psycopg

PG = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
TABLES = ("conveyor_jobs", "conveyor_workers", "conveyor_leaders")


def writes(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        rows = conn.execute(
            "SELECT relname, n_tup_upd + n_tup_ins FROM pg_stat_user_tables"
            " WHERE relname = ANY(%s)",
            [list(TABLES)],
        ).fetchall()
    return {name: int(n) for name, n in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=100)
    args = parser.parse_args()
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS bench_heartbeat WITH (FORCE)")
        conn.execute("CREATE DATABASE bench_heartbeat")
    url = f"{PG}/bench_heartbeat"

    import conveyor
    from conveyor import Conveyor
    from conveyor.runtime.worker import Worker

    app = Conveyor(url)

    @app.task
    async def hold(seconds: float) -> None:
        await asyncio.sleep(seconds)

    hold.send_many([(120.0,)] * args.concurrency)
    worker = Worker(app, queues=["default"], concurrency=args.concurrency)
    thread = threading.Thread(target=lambda: worker.run(install_signals=False), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = sum(c.count for c in app.counts() if c.state == "running")
        if running == args.concurrency:
            break
        time.sleep(0.2)
    time.sleep(3)  # past the claim's own writes
    before = writes(url)
    time.sleep(args.window)
    after = writes(url)
    worker.stop(graceful=False)
    thread.join(30)
    per_s = {t: (after.get(t, 0) - before.get(t, 0)) / args.window for t in TABLES}
    print(
        f"conveyor {getattr(conveyor, '__version__', '?')} ({conveyor.__file__}): "
        f"{args.concurrency} running jobs, one worker, {args.window:g} s: rows written per "
        "second: " + ", ".join(f"{t} {v:.2f}" for t, v in per_s.items())
    )
    app.close()


if __name__ == "__main__":
    main()
