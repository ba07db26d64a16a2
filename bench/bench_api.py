"""HTTP API benchmark: jobs created per second through the server, and the drain
rate of one remote HTTP worker beside an in-process worker's, in the same run.

Its own script; results are appended as JSON lines to ``--out`` and printed as a
small table. ``bench/run.sh`` (``make bench``) runs it after the other steps.

For each backend (PostgreSQL, SQLite), in a fresh database (PostgreSQL database
``bench_api`` dropped and created, or a new SQLite file), with ``conveyor
server --no-services`` running in a subprocess on a free loopback port:

- ``create_single``: ``--single`` (2,000) ``POST /v1/jobs``, one after another on
  one keep-alive httpx client: jobs / elapsed;
- ``create_bulk``: ``--n`` (20,000) jobs as ``POST /v1/jobs/bulk`` of 1,000 each;
- ``drain_remote``: ``--n`` no-op jobs (enqueued by the producer, not timed), then
  ONE remote worker (this process, httpx only) loops ``POST /v1/leases``
  (``limit`` 100) and ``POST /v1/leases/outcomes`` (the 100 completions in one
  call): jobs / (last outcome accepted - first lease answered);
- ``drain_inprocess``: the same number of no-op async jobs run by ONE in-process
  ``Worker(concurrency=100, fetch_batch=100)``: jobs / (last handler end - first
  handler start), the shared harness's definition.

    PEERBENCH_PG=postgresql://postgres@127.0.0.1:5432 \\
        /tmp/peerbench/venv/bin/python bench/bench_api.py --out /tmp/peerbench/api.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from _bench import REPO, SCRATCH, commit, db_url, emit, fresh_database

import conveyor
from conveyor import Conveyor
from conveyor.runtime.worker import Worker

PG_DB = "bench_api"
SQLITE_FILE = SCRATCH / "bench_api.db"
QUEUE = "bench_api"
TASK = "api_noop"
BATCH = 100
CHUNK = 1000


def say(msg: str) -> None:
    print(f"bench_api: {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``conveyor server`` in a subprocess, on a free loopback port."""

    def __init__(self, url: str) -> None:
        self.base = f"http://127.0.0.1:{free_port()}"
        port = self.base.rsplit(":", 1)[1]
        self.log = open(SCRATCH / "bench_api_server.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "conveyor.cli.main",
                "-d",
                url,
                "server",
                "--port",
                port,
                "--no-services",
                "--log-level",
                "warning",
            ],
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.base + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start; see {self.log.name}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(15)
        self.log.close()


def create_single(client: httpx.Client, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        r = client.post("/v1/jobs", json={"task": TASK, "args": [i], "queue": "created"})
        assert r.status_code == 201, r.text
    return n / (time.perf_counter() - t0)


def create_bulk(client: httpx.Client, n: int) -> float:
    t0 = time.perf_counter()
    for start in range(0, n, CHUNK):
        jobs = [
            {"task": TASK, "args": [i], "queue": "created"}
            for i in range(start, min(n, start + CHUNK))
        ]
        r = client.post("/v1/jobs/bulk", json={"jobs": jobs})
        assert r.status_code == 201, r.text
    return n / (time.perf_counter() - t0)


def enqueue(app: Conveyor, n: int) -> None:
    for start in range(0, n, CHUNK):
        app.enqueue_many(TASK, [(i,) for i in range(start, min(n, start + CHUNK))], queue=QUEUE)


def drain_remote(client: httpx.Client, n: int) -> tuple[float, int]:
    """One remote worker: lease 100, complete them in one call, again."""
    done = calls = 0
    first = None
    while done < n:
        r = client.post(
            "/v1/leases",
            json={
                "worker": "bench-remote",
                "queues": [QUEUE],
                "tasks": [TASK],
                "limit": BATCH,
                "wait_s": 1,
            },
        )
        calls += 1
        jobs = r.json()["jobs"]
        if not jobs:
            continue
        first = first or time.perf_counter()
        outcomes = [{"job_id": j["id"], "token": j["token"], "kind": "complete"} for j in jobs]
        r = client.post(
            "/v1/leases/outcomes", json={"worker": "bench-remote", "outcomes": outcomes}
        )
        calls += 1
        done += sum(1 for x in r.json()["results"] if x["accepted"])
    return n / (time.perf_counter() - (first or time.perf_counter())), calls


def drain_inprocess(url: str, n: int) -> float:
    app = Conveyor(url)
    state: dict[str, float | int | None] = {"count": 0, "first": None, "last": None}
    worker: Worker | None = None

    @app.task(name=TASK, queue=QUEUE)
    async def noop(i: int) -> None:
        now = time.time()
        state["first"] = state["first"] or now
        state["count"] = int(state["count"] or 0) + 1
        state["last"] = now
        if state["count"] >= n and worker is not None:
            worker.stop()

    enqueue(app, n)
    worker = Worker(app, queues=[QUEUE], concurrency=BATCH, fetch_batch=BATCH)
    asyncio.run(worker.run_async())
    app.close()
    return n / (float(state["last"] or 0) - float(state["first"] or 0))


def run_backend(backend: str, args: argparse.Namespace) -> list[dict]:
    rows = []
    url = db_url(backend, PG_DB, SQLITE_FILE)

    def row(metric: str, value: float, **extra) -> None:
        r = {
            "bench": "api",
            "backend": backend,
            "metric": metric,
            "jobs_per_s": round(value, 1),
            "conveyor": commit(),
            "version": conveyor.__version__,
            **extra,
        }
        rows.append(r)
        emit(r, args.out)

    fresh_database(backend, PG_DB, SQLITE_FILE)
    producer = Conveyor(url)
    producer.migrate()
    server = Server(url)
    try:
        with httpx.Client(base_url=server.base, timeout=120) as client:
            say(f"{backend}: {args.single} single POSTs")
            row("create_single", create_single(client, args.single), n=args.single)
            say(f"{backend}: {args.n} jobs in bulk POSTs of {CHUNK}")
            row("create_bulk", create_bulk(client, args.n), n=args.n, per_request=CHUNK)
            enqueue(producer, args.n)
            say(f"{backend}: {args.n} jobs drained by one remote HTTP worker, batches of {BATCH}")
            rate, calls = drain_remote(client, args.n)
            row("drain_remote", rate, n=args.n, batch=BATCH, http_calls=calls)
    finally:
        server.stop()
        producer.close()
    say(f"{backend}: {args.n} jobs drained by one in-process worker")
    row("drain_inprocess", drain_inprocess(url, args.n), n=args.n, concurrency=BATCH)
    return rows


def table(rows: list[dict]) -> str:
    metrics = ["create_single", "create_bulk", "drain_remote", "drain_inprocess"]
    names = {
        "create_single": "create, one POST per job",
        "create_bulk": f"create, POST /v1/jobs/bulk ({CHUNK}/request)",
        "drain_remote": f"drain, one remote HTTP worker ({BATCH}/lease)",
        "drain_inprocess": f"drain, one in-process worker ({BATCH} concurrency)",
    }
    backends = sorted({r["backend"] for r in rows}, reverse=True)
    out = ["| jobs/s | " + " | ".join(backends) + " |", "|---|" + "---:|" * len(backends)]
    for m in metrics:
        cells = [
            next(
                (f"{r['jobs_per_s']:,.0f}" for r in rows if r["backend"] == b and r["metric"] == m),
                "",
            )
            for b in backends
        ]
        out.append(f"| {names[m]} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both")
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--single", type=int, default=2_000)
    p.add_argument("--out")
    args = p.parse_args()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    backends = ["postgres", "sqlite"] if args.backend == "both" else [args.backend]
    rows = [r for b in backends for r in run_backend(b, args)]
    print(table(rows))


if __name__ == "__main__":
    Path(SCRATCH).mkdir(parents=True, exist_ok=True)
    main()
