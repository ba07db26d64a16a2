"""Workflow benchmark: the delay from a parent's end to its dependent's start, and
a 10,000-node workflow from start() to its end.

The workers are ``conveyor worker --app workflow_app:app`` (run in bench/) processes with
the CLI's defaults, as a user runs them. Both timestamps of a delay are the
database's own (the parent job's ``finished_at``, the dependent's attempt
``started_at``), so the delay is what the flow leader and the claim add.

1. delay: a linear workflow of ``--chain`` (200) no-op nodes, each receiving its
   parent's result, run by one idle worker; per edge, dependent start - parent
   end; p50/p99/max ms.
2. graph: ``--layers`` (100) layers of ``--width`` (100) no-op nodes, each node
   after two of the layer before (its column and the next): 10,000 nodes,
   19,800 edges; the time from ``wf.start()`` (which writes every node in one
   transaction, included) to the run's end, with ``--workers`` (1) processes.
3. map: one node returning ``list(range(--items))`` (10,000), a ``map`` over it,
   and a node receiving the 10,000 results: start() to end.

    PEERBENCH_PG=postgresql://postgres@127.0.0.1:5432 \\
        .venv/bin/python bench/bench_workflows.py --backend postgres
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _bench import REPO, SCRATCH, commit, db_url, emit, fresh_database, pct

from conveyor import Conveyor

PG_DB = "bench_workflows"
SQLITE_FILE = SCRATCH / "bench_workflows.db"
APP = "workflow_app:app"  # bench/ on PYTHONPATH


def start_workers(url: str, n: int) -> list[subprocess.Popen]:
    env = {**os.environ, "CONVEYOR_DATABASE_URL": url, "PYTHONPATH": str(REPO / "bench")}
    cli = str(Path(sys.executable).with_name("conveyor"))
    procs = [
        subprocess.Popen(
            [cli, "worker", "--app", APP, "--queues", "wf"],
            cwd=REPO / "bench",
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]
    time.sleep(2.0)  # started and idle (the leader elected)
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)


def delay(app: Conveyor, n: int) -> dict[str, float]:
    step = app.tasks["step"]
    wf = app.workflow("delay")
    node = wf.add(step.s(0))
    for _ in range(n - 1):
        node = wf.add(step.s(), after=[node])
    run = wf.start()
    assert run.wait(timeout=600) == "succeeded", run.record()
    nodes = run.nodes()
    gaps = []
    for parent, child in itertools.pairwise(nodes):
        ended = app.get_job(parent.job_id or 0).finished_at
        started = app.get_job(child.job_id or 0).attempt_log()[-1].started_at
        assert ended is not None and started is not None
        gaps.append((started - ended).total_seconds() * 1000)
    return {
        "p50_ms": round(pct(gaps, 50), 2),
        "p99_ms": round(pct(gaps, 99), 2),
        "max_ms": round(max(gaps), 2),
        "mean_ms": round(statistics.mean(gaps), 2),
    }


def graph(app: Conveyor, layers: int, width: int) -> dict[str, float]:
    step = app.tasks["step"]
    wf = app.workflow("graph")
    t0 = time.perf_counter()
    prev = [wf.add(step.s(c), name=f"0.{c}") for c in range(width)]
    for layer in range(1, layers):
        prev = [
            wf.add(step.s(), after=[prev[c], prev[(c + 1) % width]], name=f"{layer}.{c}")
            for c in range(width)
        ]
    declared = time.perf_counter()
    run = wf.start()
    written = time.perf_counter()
    assert run.wait(timeout=1800) == "succeeded", run.record()
    end = time.perf_counter()
    nodes = layers * width
    return {
        "nodes": nodes,
        "declare_s": round(declared - t0, 2),
        "start_s": round(written - declared, 2),
        "total_s": round(end - declared, 2),
        "nodes_per_s": round(nodes / (end - declared)),
    }


def fan(app: Conveyor, items: int) -> dict[str, float]:
    t = app.tasks
    wf = app.workflow("map")
    source = wf.add(t["numbers"].s(items))
    m = wf.map(t["step"].s(), over=source)
    last = wf.add(t["total"].s(), after=[m])
    t0 = time.perf_counter()
    run = wf.start()
    assert run.wait(timeout=1800) == "succeeded", run.record()
    took = time.perf_counter() - t0
    assert run.result(last) == sum(range(items))
    return {"items": items, "total_s": round(took, 2), "items_per_s": round(items / took)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["postgres", "sqlite", "mysql"], default="postgres")
    ap.add_argument("--chain", type=int, default=200)
    ap.add_argument("--layers", type=int, default=100)
    ap.add_argument("--width", type=int, default=100)
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.backend == "mysql":
        url = os.environ.get("BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/bench_workflows")
        import pymysql

        with pymysql.connect(host="127.0.0.1", user="root") as conn, conn.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS bench_workflows")
            cur.execute("CREATE DATABASE bench_workflows")
    else:
        fresh_database(args.backend, PG_DB, SQLITE_FILE)
        url = db_url(args.backend, PG_DB, SQLITE_FILE)
    sys.path.insert(0, str(REPO / "bench"))
    os.environ["CONVEYOR_DATABASE_URL"] = url
    import workflow_app

    app: Conveyor = workflow_app.app
    app.migrate()
    base = {"bench": "workflows", "backend": args.backend, "commit": commit()}
    procs = start_workers(url, 1)
    try:
        emit({**base, "measure": "delay", "nodes": args.chain, **delay(app, args.chain)}, args.out)
    finally:
        stop(procs)
    procs = start_workers(url, args.workers)
    try:
        row = graph(app, args.layers, args.width)
        emit({**base, "measure": "graph", "workers": args.workers, **row}, args.out)
        row = fan(app, args.items)
        emit({**base, "measure": "map", "workers": args.workers, **row}, args.out)
    finally:
        stop(procs)
    app.close()


if __name__ == "__main__":
    main()
