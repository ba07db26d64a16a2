"""Two source trees side by side on bench_scale's drain (PostgreSQL or SQLite).

This VM's speed drifts 30-40% within minutes, so a change is judged by drains of
both trees in the same minutes: each round runs tree A then B (B then A in the
next round), each drain by ``conveyor worker --burst`` processes of that tree (a
fresh interpreter with PYTHONPATH=<tree>/src), and the report is each side's
median and the median of the rounds' B/A ratios, with the Lock waits that
bench_scale's sampler saw and the worker processes' CPU per job (user + system,
start-up included), which a loaded machine moves less than the rate. Each tree
drains in its own database, migrated by that tree, so trees with different
schemas compare on their own schema.

    git worktree add /tmp/base HEAD      # A: what is committed
    .venv/bin/python bench/ab_scale.py /tmp/base . --processes 1,4 --rounds 3
    .venv/bin/python bench/ab_scale.py /tmp/base . --backend sqlite --processes 1
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
# argv: bench dir, backend, side (a/b), then the drain's jobs and processes.
DRAIN = """
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import bench_scale as bs
from _bench import db_url
backend, side, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
url = db_url(backend, f"{bs.PG_DB}_{side}", bs.SQLITE_FILE.with_name(f"ab_{side}.db"))
row = bs.drain(backend, url, n, int(sys.argv[5]))
ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # the worker processes, whole runs
row["cpu_us"] = round((ru.ru_utime + ru.ru_stime) * 1e6 / n, 1)
print(json.dumps(row))
"""

MIGRATE = """
import sys
sys.path.insert(0, sys.argv[1])
import bench_scale as bs
from _bench import db_url, fresh_database
from conveyor import Conveyor
backend, side = sys.argv[2], sys.argv[3]
where = (backend, f"{bs.PG_DB}_{side}", bs.SQLITE_FILE.with_name(f"ab_{side}.db"))
fresh_database(*where)
app = Conveyor(db_url(*where))
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
    p.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    a = p.parse_args()
    trees = [a.a.resolve(), a.b.resolve()]
    for t in trees:
        if not (t / "src" / "conveyor").is_dir():
            raise SystemExit(f"{t} has no src/conveyor")
    procs = [int(x) for x in a.processes.split(",")]
    for side, t in enumerate(trees):
        run(t, MIGRATE, a.backend, "ab"[side])
    rates: dict[tuple[int, int], list[int]] = {}
    cpus: dict[tuple[int, int], list[float]] = {}
    for r in range(a.rounds):
        for k in procs:
            for side in (0, 1) if r % 2 == 0 else (1, 0):
                out = run(trees[side], DRAIN, a.backend, "ab"[side], str(a.n), str(k))
                row = json.loads(out.splitlines()[-1])
                rates.setdefault((side, k), []).append(row["rate"])
                cpus.setdefault((side, k), []).append(row["cpu_us"])
                locks = {w: n for w, n in row.get("waits", {}).items() if w.startswith("Lock")}
                print(
                    f"round {r + 1} {'AB'[side]} {k} process(es): {row['rate']:,} jobs/s, "
                    f"worker CPU {row['cpu_us']} us/job; "
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
        ca, cb = cpus[(0, k)], cpus[(1, k)]
        cpu_ratio = statistics.median(y / x for x, y in zip(ca, cb, strict=True))
        print(
            f"{k} process(es) worker CPU per job: A {statistics.median(ca)} us, "
            f"B {statistics.median(cb)} us; B/A by round, median {cpu_ratio:.2f}x"
        )


if __name__ == "__main__":
    main()
