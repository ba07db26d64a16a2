"""How much of a MariaDB drain the job table's shape costs: the upper bound of each
cut, measured by taking that part away in a scratch database and draining there.

Each cut breaks what it removes (the counts, the finished days, the dashboard's
indexes): this measures what a schema change could win at most, it proposes
none. Per round, for each variant in turn: a new database, `conveyor migrate`,
the cut, then `conveyor bench --phases drain --rounds 1` (the CLI worker with its
defaults, 20,000 jobs) while the server's CPU (mariadbd's utime+stime) is read
before and after.

    .venv/bin/python bench/lab/mysql_schema_cuts.py --rounds 3

Variants:
  none        the schema as migrated
  indexes     9 of the job table's 14 secondary indexes dropped (kept: fetch,
              unique key, idempotency key, running key)
  triggers    the count triggers on UPDATE dropped (the job and batch counts)
  no-move     a finished job stays in the live partition (part stays 0)
  checks      the JSON CHECK constraints dropped
  all         all four
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import pymysql
from drain_options import HZ, server_ticks  # (this folder: run as a script)

from conveyor.backends.mysql.backend import parse_url

CONVEYOR = os.path.join(os.path.dirname(sys.executable), "conveyor")

INDEXES = ", ".join(
    f"DROP INDEX conveyor_jobs_{name}_idx"
    for name in (
        "problem",
        "waiting",
        "owner",
        "changed",
        "time",
        "tenant",
        "spread",
        "batch",
        "chain_due",
    )
)
CUTS = {
    "indexes": [f"ALTER TABLE conveyor_jobs {INDEXES}"],
    "triggers": [
        "DROP TRIGGER conveyor_count_update",
        "DROP TRIGGER conveyor_batch_count_update",
    ],
    "no-move": [
        "DROP TRIGGER conveyor_jobs_part_update",
        "CREATE TRIGGER conveyor_jobs_part_update BEFORE UPDATE ON conveyor_jobs "
        "FOR EACH ROW SET NEW.part = 0",
    ],
    # column CHECKs have no name to drop: the columns are defined again without
    "checks": [
        "ALTER TABLE conveyor_jobs MODIFY args longtext NOT NULL, "
        + ", ".join(
            f"MODIFY {c} longtext DEFAULT NULL"
            for c in ("backoff", "result", "context", "chain", "pinned_to")
        )
    ],
}
CUTS["all"] = [sql for name in ("indexes", "triggers", "no-move", "checks") for sql in CUTS[name]]
VARIANTS = ["none", *CUTS]


def drain(base: str, variant: str, jobs: int) -> tuple[float, float, float]:
    """jobs/s, the worker's CPU per job and the server's CPU per job (µs)."""
    database = f"lab_cuts_{variant.replace('-', '_')}"
    server = {k: v for k, v in parse_url(base).items() if k != "database"}
    admin = pymysql.connect(**server, autocommit=True)
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
        cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    url = f"{base.rpartition('/')[0]}/{database}"
    subprocess.run([CONVEYOR, "-d", url, "migrate"], check=True, capture_output=True)
    conn = pymysql.connect(**server, database=database, autocommit=True)
    with conn.cursor() as cur:
        for sql in CUTS.get(variant, []):
            cur.execute(sql)
    conn.close()
    # enqueueing is in the bench's drain phase too: the server's CPU over the
    # whole run is taken, less that of a run of the enqueue alone
    before = server_ticks(url)
    command = [CONVEYOR, "bench", "-d", url, "--phases", "drain", "--rounds", "1"]
    out = subprocess.run(
        [*command, "-n", str(jobs), "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    server_s = (server_ticks(url) - before) / HZ
    result = json.loads(out)["results"]["drain"]
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE `{database}`")
    admin.close()
    return result["jobs_per_s"], result["cpu_us_per_job"], server_s / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base", default="mysql://root@127.0.0.1:3306/mysql", help="the server (its URL)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", "--jobs", type=int, default=20000)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    variants = args.variants.split(",")
    got: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for variant in variants if r % 2 == 0 else reversed(variants):
            got[variant].append(drain(args.base, variant, args.jobs))
            rate, worker, server = got[variant][-1]
            print(
                f"round {r + 1} {variant:9} {rate:8,.0f} jobs/s  worker {worker:5.1f} µs/job  "
                f"server (enqueue included) {server:5.0f} µs/job",
                flush=True,
            )
            time.sleep(1)
    base_rate = statistics.median(g[0] for g in got["none"]) if "none" in got else None
    print("\n| variant | jobs/s, median | vs none | worker µs/job | server µs/job |")
    print("|---|---|---|---|---|")
    for variant, runs in got.items():
        rate = statistics.median(g[0] for g in runs)
        ratio = f"{rate / base_rate:.2f}x" if base_rate else "-"
        worker = statistics.median(g[1] for g in runs)
        server = statistics.median(g[2] for g in runs)
        print(f"| {variant} | {rate:,.0f} | {ratio} | {worker:.0f} | {server:.0f} |")


if __name__ == "__main__":
    main()
