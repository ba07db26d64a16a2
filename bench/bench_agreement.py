"""`conveyor bench --pgqueuer` beside the shared peer harness, in one run: do the
two measures of Conveyor's drain against PgQueuer batch 100 agree?

Blocks alternate: one `conveyor bench --phases drain --pgqueuer --rounds R`
(its own alternating rounds), then R rounds of the harness (a new database per
run: `bench_pgqueuer.py --batch-size 100` and `bench_conveyor.py --cli`, which
drains with `conveyor worker --queues bench --burst` and the CLI's defaults, in
alternating order). Each measure's ratio is the median of its rounds' ratios,
from the first handler start to the last end, and over the worker process's
wall time; the load average is printed with each block.

    PEERBENCH_PG=postgresql://postgres@127.0.0.1:5432 \\
        .venv/bin/python bench/bench_agreement.py --n 20000 --blocks 2 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
from _bench import PG_BASE, REPO, commit

PEERS = Path(os.environ.get("PEERBENCH_PEERS") or REPO.parent / "shared" / "bench" / "peers")
DB = "bench_agreement"


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def conveyor_bench(n: int, rounds: int) -> list[tuple[float, float]]:
    with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    argv = [sys.executable, "-m", "conveyor.cli.main", "bench", "-d", f"{PG_BASE}/{DB}"]
    argv += ["--jobs", str(n), "--rounds", str(rounds), "--phases", "drain", "--pgqueuer"]
    out = subprocess.run([*argv, "--json"], check=True, capture_output=True, text=True).stdout
    d = json.loads(out)["results"]["drain"]
    return list(zip(d["round_ratios"], d["wall_ratios"], strict=True))


def harness_run(script: str, n: int, *extra: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        argv = [sys.executable, str(script), "--n", str(n), "--runs", "1", "--phases", "b"]
        done = subprocess.run([*argv, *extra, "--out", f.name], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{script} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        row: dict = json.loads(Path(f.name).read_text().splitlines()[-1])
    if row.get("processed") != n:
        raise RuntimeError(f"{script}: {row.get('processed')} of {n} jobs")
    return row


def harness(n: int, rounds: int) -> list[tuple[float, float]]:
    ratios = []
    for r in range(rounds):
        rows = {}
        for who in ("conveyor", "pgqueuer") if r % 2 == 0 else ("pgqueuer", "conveyor"):
            if who == "conveyor":
                script, extra = REPO / "bench" / "bench_conveyor.py", ["--cli"]
            else:
                script, extra = PEERS / "bench_pgqueuer.py", ["--batch-size", "100"]
            rows[who] = harness_run(str(script), n, *extra)
        c, p = rows["conveyor"], rows["pgqueuer"]
        ratios.append(
            (
                c["process_jobs_s"] / p["process_jobs_s"],
                c["process_wall_jobs_s"] / p["process_wall_jobs_s"],
            )
        )
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="rounds per block and measure")
    args = ap.parse_args()
    os.environ["PEERBENCH_PEERS"] = str(PEERS)
    os.environ.setdefault("PEERBENCH_PG", PG_BASE)
    got: dict[str, list[tuple[float, float]]] = {"conveyor bench": [], "peer harness": []}
    for b in range(args.blocks):
        for name, measure in (("conveyor bench", conveyor_bench), ("peer harness", harness)):
            before = load()
            rounds = measure(args.n, args.rounds)
            got[name] += rounds
            shown = ", ".join(f"{s:.2f}/{w:.2f}" for s, w in rounds)
            print(f"block {b + 1} {name}: {shown} (load {before} -> {load()})", file=sys.stderr)
    print(f"Commit {commit()}, {args.n:,} jobs, PostgreSQL {PG_BASE}; load now {load()}.\n")
    print("| Conveyor / PgQueuer batch 100, median of the rounds' ratios | span | wall |")
    print("|---|---|---|")
    for name, rounds in got.items():
        span = statistics.median(s for s, _ in rounds)
        wall = statistics.median(w for _, w in rounds)
        each = ", ".join(f"{s:.2f}" for s, _ in rounds)
        print(f"| {name} ({len(rounds)} rounds: {each}) | **{span:.2f}x** | {wall:.2f}x |")
    c, h = (statistics.median(s for s, _ in got[k]) for k in got)
    print(f"\nconveyor bench / peer harness: {c / h:.2f}")


if __name__ == "__main__":
    main()
