"""Keyed claims as dead rows pile up (PostgreSQL): the cost of the limit-aware
claim itself, through the backend, with no worker and so no leader to VACUUM.

Each round enqueues ``--n`` jobs keyed over 1,000 keys (``concurrency_limit=2``,
so the limit rarely binds), then claims 100 at a time and writes each batch's
successes, until none is left; the next round runs in the same database on top
of the dead rows the earlier ones left (this machine's server runs with
autovacuum off). Prints claim p50 and jobs/s per round.

    .venv/bin/python bench/bench_keyed_claims.py --rounds 4 --n 20000
"""

from __future__ import annotations

import argparse
import statistics
import time

from _bench import PG_BASE, SCRATCH, commit, emit, fresh_database

from conveyor import Conveyor
from conveyor.records import Finalize

PG_DB = "bench_keyed_claims"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--out")
    a = p.parse_args()
    fresh_database("postgres", PG_DB, SCRATCH / "unused.db")
    app = Conveyor(f"{PG_BASE}/{PG_DB}")
    task = app.task(name="keyed", queue="kq", concurrency_key="user", concurrency_limit=2)(
        lambda user, i: None
    )
    backend = app.backend
    rows = []
    for r in range(a.rounds):
        for start in range(0, a.n, 1000):
            task.send_many([(f"u{i % 1000}", i) for i in range(start, min(a.n, start + 1000))])
        claims: list[float] = []
        done, began = 0, time.perf_counter()
        while True:
            t0 = time.perf_counter()
            jobs = backend.job_claim(queues=["kq"], worker_id="bench", limit=100)
            claims.append(time.perf_counter() - t0)
            if not jobs:
                break
            done += len(jobs)
            backend.job_finalize_many(
                worker_id="bench",
                outcomes=[
                    Finalize(j.id, str(j.lease_token), "succeeded", "succeeded", "null")
                    for j in jobs
                ],
            )
        rate = done / (time.perf_counter() - began)
        p50 = statistics.median(claims) * 1000
        print(f"round {r + 1}: {done:,} jobs, {rate:,.0f} jobs/s, claim p50 {p50:.2f} ms")
        rows.append({"round": r + 1, "jobs": done, "jobs_per_s": round(rate), "claim_p50_ms": p50})
    app.close()
    emit({"bench": "keyed_claims", "rounds": rows, "commit": commit()}, a.out)


if __name__ == "__main__":
    main()
