"""Two source trees side by side on bench_scale's drain (PostgreSQL).

This VM's speed drifts 30-40% within minutes, so a change is judged by drains of
both trees in the same minutes: each round runs tree A then B (B then A in the
next round), each drain by ``conveyor worker --burst`` processes of that tree (a
fresh interpreter with PYTHONPATH=<tree>/src), and the report is each side's
median and the median of the rounds' B/A ratios, with the Lock waits that
bench_scale's sampler saw.

    git worktree add /tmp/base HEAD      # A: what is committed
    .venv/bin/python bench/ab_scale.py /tmp/base . --processes 1,4 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# One drain, in the interpreter of the tree measured (bench_scale is this file's).
DRAIN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import bench_scale as bs
from _bench import db_url
url = db_url("postgres", bs.PG_DB, bs.SQLITE_FILE)
print(json.dumps(bs.drain("postgres", url, int(sys.argv[2]), int(sys.argv[3]))))
"""

MIGRATE = """
import sys
sys.path.insert(0, sys.argv[1])
import bench_scale as bs
from _bench import db_url, fresh_database
from conveyor import Conveyor
fresh_database("postgres", bs.PG_DB, bs.SQLITE_FILE)
app = Conveyor(db_url("postgres", bs.PG_DB, bs.SQLITE_FILE))
app.migrate()
app.close()
"""


def run(tree: Path, code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code, str(HERE), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{tree}: {out.stderr.strip()[-2000:]}")
    return out.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="tree A (the baseline), a checkout with src/")
    p.add_argument("b", type=Path, help="tree B (the change)")
    p.add_argument("--processes", default="1,4", help="worker processes per drain, e.g. 1,2,4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=40_000, help="jobs per drain")
    a = p.parse_args()
    trees = [a.a.resolve(), a.b.resolve()]
    for t in trees:
        if not (t / "src" / "conveyor").is_dir():
            raise SystemExit(f"{t} has no src/conveyor")
    procs = [int(x) for x in a.processes.split(",")]
    run(trees[0], MIGRATE)  # the newer schema, if the trees differ, migrates later
    rates: dict[tuple[int, int], list[int]] = {}
    for r in range(a.rounds):
        for k in procs:
            for side in (0, 1) if r % 2 == 0 else (1, 0):
                row = json.loads(run(trees[side], DRAIN, str(a.n), str(k)).splitlines()[-1])
                rates.setdefault((side, k), []).append(row["rate"])
                locks = {w: n for w, n in row.get("waits", {}).items() if w.startswith("Lock")}
                print(
                    f"round {r + 1} {'AB'[side]} {k} process(es): {row['rate']:,} jobs/s; "
                    f"{row.get('samples', 0)} samples, Lock waits {locks or 'none'}",
                    flush=True,
                )
    print(f"A = {trees[0]}\nB = {trees[1]}")
    for k in procs:
        ra, rb = rates[(0, k)], rates[(1, k)]
        ratio = statistics.median(y / x for x, y in zip(ra, rb, strict=True))
        print(
            f"{k} process(es): A {statistics.median(ra):,.0f} {ra}, "
            f"B {statistics.median(rb):,.0f} {rb}; B/A by round, median {ratio:.2f}x"
        )


if __name__ == "__main__":
    main()
