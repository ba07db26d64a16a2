"""Claim cost on MariaDB's partitioned job table (schema v22): an empty table
against one that holds FINISHED (10,000,000 by default) succeeded jobs.

    python bench/bench_mysql_partitions.py [--finished N] [--claims N] [--url URL]

Each round sends CLAIMS jobs, claims them one at a time (limit 1, the worst
case per job) and records each claim's time, then finishes them. The finished
jobs are made fast: MariaDB's sequence engine (seq_1_to_N) fills a table of the
job table's shape, without its triggers (no count deltas, no keys), and
EXCHANGE PARTITION swaps it in as the partition of the jobs finished before the
upgrade. Their counts are not
folded in (the dashboard's counts would miss them); claims do not read them.
The database (conveyor_bench_parts) is made anew each run and dropped after.

MariaDB 10.11, 2 shared cores, 128 MB buffer pool (2026-11-28):
    empty table                  claims=2000 median=4.10 ms p95=11.32 ms mean=5.26 ms
    10,000,000 finished jobs     claims=2000 median=4.20 ms p95=10.91 ms mean=5.22 ms
(the 10,000,000 jobs took 1,107 s to make; the empty-table figure is from a run
with --finished 0 on a quieter machine: the same run's, taken while other tests
loaded both cores, was 21.6 ms)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pymysql

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from conveyor.backends import open_backend
from conveyor.backends.mysql.backend import MySQLBackend, parse_url
from conveyor.records import Finalize, JobInsert

DB = "conveyor_bench_parts"


def job(i: int) -> JobInsert:
    return JobInsert(queue="q", task="t", args_json=f'{{"args": [{i}], "kwargs": {{}}}}')


def claim_times(backend: MySQLBackend, claims: int) -> list[float]:
    """Send `claims` jobs, claim them one by one, then finish them all."""
    backend.job_insert_many(jobs=[job(i) for i in range(claims)])
    times: list[float] = []
    got = []
    for _ in range(claims):
        t0 = time.perf_counter()
        rows = backend.job_claim(worker_id="w", queues=["q"], limit=1, lease_s=60.0)
        times.append(time.perf_counter() - t0)
        got += rows
    assert len(got) == claims, len(got)
    outcomes = [
        Finalize(job_id=j.id, token=j.lease_token or "", state="succeeded", outcome="succeeded")
        for j in got
    ]
    backend.job_finalize_many(worker_id="w", outcomes=outcomes)
    return times


def fill_finished(conn: pymysql.connections.Connection, n: int) -> float:
    """n succeeded jobs into the partition of those from before the upgrade."""
    t0 = time.perf_counter()
    with conn.cursor() as cur:
        cur.execute(
            "SELECT PARTITION_NAME, PARTITION_DESCRIPTION FROM information_schema.PARTITIONS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'conveyor_jobs' "
            "AND PARTITION_NAME LIKE 'succeeded\\_before\\_%%'"
        )
        part, bound = cur.fetchone()
        cur.execute("SELECT COALESCE(MAX(id), 0) FROM conveyor_jobs")
        (top,) = cur.fetchone()
        cur.execute("CREATE TABLE bulk LIKE conveyor_jobs_dropped")
        # one day per 100,000 jobs, all before today: the partition's range
        cur.execute(
            "INSERT INTO bulk (id, queue, task, args, state, max_attempts, attempt, "
            "created_at, scheduled_at, started_at, finished_at, lease_owner, part) "
            f"SELECT {int(top)} + seq, 'q', 't', '[]', 'succeeded', 3, 1, f, f, f, f, 'w', "
            "1000000 + TO_DAYS(f) FROM (SELECT seq, UTC_DATE() - INTERVAL 1 DAY "
            "- INTERVAL (seq DIV 100000) DAY + INTERVAL (seq MOD 86400) SECOND AS f "
            f"FROM seq_1_to_{int(n)}) s"
        )
        cur.execute(f"ALTER TABLE conveyor_jobs EXCHANGE PARTITION {part} WITH TABLE bulk")
        cur.execute("DROP TABLE bulk")
        # ids go on above the finished ones (ids are unique across partitions)
        cur.execute(f"ALTER TABLE conveyor_jobs AUTO_INCREMENT = {int(top) + int(n) + 1}")
        cur.execute("ANALYZE TABLE conveyor_jobs")
        cur.fetchall()
        assert int(bound) > 0
    return time.perf_counter() - t0


def summary(label: str, times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    p95 = ms[int(len(ms) * 0.95) - 1]
    return (
        f"{label:<28} claims={len(ms)} median={statistics.median(ms):.2f} ms "
        f"p95={p95:.2f} ms mean={statistics.fmean(ms):.2f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="mysql://root@127.0.0.1:3306")
    ap.add_argument("--finished", type=int, default=10_000_000)
    ap.add_argument("--claims", type=int, default=2000)
    a = ap.parse_args()
    admin = pymysql.connect(**_server(a.url))
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        cur.execute(f"CREATE DATABASE {DB}")
    backend = open_backend(f"{a.url.rstrip('/')}/{DB}")
    assert isinstance(backend, MySQLBackend)
    try:
        backend.migrate()
        claim_times(backend, 200)  # warm-up
        print(summary("empty table", claim_times(backend, a.claims)), flush=True)
        if a.finished <= 0:
            return
        backend.close()  # its sessions would hold the table's metadata lock
        conn = pymysql.connect(**_server(a.url), database=DB, autocommit=True)
        took = fill_finished(conn, a.finished)
        conn.close()
        backend = open_backend(f"{a.url.rstrip('/')}/{DB}")
        assert isinstance(backend, MySQLBackend)
        print(f"made {a.finished:,} finished jobs in {took:.0f} s", flush=True)
        claim_times(backend, 200)
        label = f"{a.finished:,} finished jobs"
        print(summary(label, claim_times(backend, a.claims)), flush=True)
    finally:
        backend.close()
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        admin.close()


def _server(url: str) -> dict[str, object]:
    kw = parse_url(url.rstrip("/") + "/mysql")
    return {k: kw[k] for k in ("host", "port", "user", "password") if k in kw}


if __name__ == "__main__":
    main()
