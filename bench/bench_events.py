"""Live events and metrics benchmark (issue 11): what following the event stream
costs the workers, how late events reach a client, and what a scrape of
``/metrics`` costs on a 1,000,000-job table.

Its own script; results are appended as JSON lines to ``--out`` and printed as a
small table. ``bench/run.sh`` (``make bench``) runs it after the other steps.

For each backend (PostgreSQL, SQLite), in a fresh database:

- ``drain_events_off`` / ``drain_events_on``: ``--n`` (20,000) no-op jobs drained
  by ONE ``conveyor worker`` process with the CLI's defaults (``--burst``), with
  no event client, then with ``conveyor server`` running and one SSE client
  reading every event of ``/v1/events``; alternated ``--runs`` (2) times each.
  Rate: jobs / (last finished_at - first started_at), read from the jobs.
- ``event_delay``: a worker running, 500 jobs sent at 50/s; for each
  ``job.succeeded`` event, the time from the job's ``finished_at`` to the SSE
  client reading it: p50 and p99 (one clock: everything runs on this machine).
- ``scrape_1m``: 1,000,000 jobs (10 queues x 5 tasks; 90 % succeeded, the rest
  waiting), then ``GET /metrics`` 20 times: p50 and max milliseconds.

    PEERBENCH_PG=postgresql://postgres@127.0.0.1:5432 \\
        /tmp/peerbench/venv/bin/python bench/bench_events.py --out /tmp/peerbench/events.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import psycopg
from _bench import REPO, SCRATCH, commit, db_url, emit, fresh_database, pct
from bench_api import Server

import conveyor
from conveyor import Conveyor

PG_DB = "bench_events"
SQLITE_FILE = SCRATCH / "bench_events.db"
QUEUE = "bench_events"
TASK = "noop"
CHUNK = 10_000


def say(msg: str) -> None:
    print(f"bench_events: {msg}", file=sys.stderr, flush=True)


def worker(url: str, *extra: str) -> subprocess.Popen:
    """``conveyor worker`` with the CLI's defaults, on the bench's app."""
    env = {
        **os.environ,
        "CONVEYOR_DATABASE_URL": url,
        # the Conveyor this script imported (PYTHONPATH=<another checkout>/src compares)
        "PYTHONPATH": f"{Path(conveyor.__file__).parents[1]}{os.pathsep}{REPO / 'bench'}",
    }
    cmd = [sys.executable, "-m", "conveyor.cli.main", "worker", "--app", "events_app:app"]
    cmd += ["--queues", QUEUE, "--log-level", "warning", *extra]
    return subprocess.Popen(cmd, cwd=REPO, env=env)


class Follower(threading.Thread):
    """One SSE client reading ``/v1/events`` as fast as it can."""

    def __init__(self, base: str, **params: str) -> None:
        super().__init__(daemon=True)
        self.base, self.params = base, params
        self.events = 0
        self.succeeded: list[tuple[float, str]] = []  # (read at, finished_at)
        self.open = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            self._follow()
        except httpx.TransportError:
            if not self.stop.is_set():
                raise
            # the server closed the stream as the run ended: nothing lost

    def _follow(self) -> None:
        with (
            httpx.Client(base_url=self.base, timeout=None) as c,
            c.stream("GET", "/v1/events", params=self.params) as r,
        ):
            self.open.set()
            kind = ""
            for line in r.iter_lines():
                if self.stop.is_set():
                    return
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    self.events += 1
                    if kind == "job.succeeded":
                        data = json.loads(line[5:])
                        self.succeeded.append((time.time(), data["finished_at"]))


def span_rate(backend: str, url: str, n: int) -> float:
    """jobs / (last finished_at - first started_at), from the jobs themselves."""
    if backend == "postgres":
        with psycopg.connect(url) as c:
            first, last = c.execute(
                "SELECT extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at))"
                " FROM conveyor_jobs WHERE queue = %s",
                (QUEUE,),
            ).fetchone()
    else:
        with sqlite3.connect(url.removeprefix("sqlite:///")) as c:
            first, last = c.execute(
                "SELECT min(started_at), max(finished_at) FROM conveyor_jobs WHERE queue = ?",
                (QUEUE,),
            ).fetchone()
    return n / (float(last) - float(first))


def enqueue(app: Conveyor, n: int, **options) -> None:
    for start in range(0, n, CHUNK):
        app.enqueue_many(TASK, [(i,) for i in range(start, min(n, start + CHUNK))], **options)


def drain(backend: str, n: int, *, events: bool) -> tuple[float, int]:
    fresh_database(backend, PG_DB, SQLITE_FILE)
    url = db_url(backend, PG_DB, SQLITE_FILE)
    app = Conveyor(url)
    app.migrate()
    server = follower = None
    if events:
        server = Server(url)
        follower = Follower(server.base)
        follower.start()
        follower.open.wait(30)
    enqueue(app, n, queue=QUEUE)
    w = worker(url, "--burst")
    if w.wait(600) != 0:
        raise SystemExit(f"the worker exited with {w.returncode}")
    rate = span_rate(backend, url, n)
    seen = 0
    if follower is not None and server is not None:
        deadline = time.monotonic() + 60
        while follower.events < n and time.monotonic() < deadline:
            time.sleep(0.1)  # the client catches up (it reads the latest state of each job)
        seen = follower.events
        follower.stop.set()
        server.stop()
    app.close()
    return rate, seen


def event_delay(backend: str, count: int = 500, rate: float = 50.0) -> list[float]:
    fresh_database(backend, PG_DB, SQLITE_FILE)
    url = db_url(backend, PG_DB, SQLITE_FILE)
    app = Conveyor(url)
    app.migrate()
    server = Server(url)
    follower = Follower(server.base, queue=QUEUE)
    follower.start()
    follower.open.wait(30)
    w = worker(url)
    try:
        time.sleep(2)  # the worker is up
        for i in range(count):
            app.enqueue(TASK, [i], queue=QUEUE)
            time.sleep(1 / rate)
        deadline = time.monotonic() + 30
        while len(follower.succeeded) < count and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        w.terminate()
        w.wait(30)
        follower.stop.set()
        server.stop()
        app.close()
    return [
        (read - datetime.fromisoformat(finished).timestamp()) * 1000
        for read, finished in follower.succeeded
    ]


def scrape_1m(backend: str, total: int, scrapes: int = 20) -> list[float]:
    fresh_database(backend, PG_DB, SQLITE_FILE)
    url = db_url(backend, PG_DB, SQLITE_FILE)
    app = Conveyor(url)
    app.migrate()
    t0 = time.perf_counter()
    per = total // 50
    for q in range(10):
        for t in range(5):
            for start in range(0, per, CHUNK):
                items = [(i,) for i in range(start, min(per, start + CHUNK))]
                app.enqueue_many(f"task{t}", items, queue=f"q{q}")
    # 90 % of them finished (a table as a cluster has it after a while): a bench-only
    # shortcut through the database, counted by the same triggers as workers' writes
    finish = (
        "UPDATE conveyor_jobs SET state = 'succeeded', attempt = 1, started_at = {now},"
        " finished_at = {now} WHERE id % 10 <> 0"
    )
    if backend == "postgres":
        with psycopg.connect(url) as c:
            c.execute(finish.format(now="now()"))
    else:
        with sqlite3.connect(url.removeprefix("sqlite:///")) as c:
            c.execute(finish.format(now="unixepoch('subsec')"))
    say(f"{backend}: {total:,} jobs in {time.perf_counter() - t0:.0f}s")
    app.close()
    server = Server(url)
    times = []
    try:
        with httpx.Client(base_url=server.base, timeout=60) as client:
            client.get("/metrics")  # warm
            for _ in range(scrapes):
                t = time.perf_counter()
                r = client.get("/metrics")
                times.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200 and "conveyor_jobs{" in r.text, r.text[:500]
            total_seen = sum(
                float(line.rsplit(" ", 1)[1])
                for line in r.text.splitlines()
                if line.startswith("conveyor_jobs{")
            )
            assert total_seen == per * 50, total_seen
    finally:
        server.stop()
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both")
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--only", choices=["drain", "delay", "scrape"], action="append")
    p.add_argument(
        "--no-events", action="store_true", help="drain with events off only (older checkouts)"
    )
    p.add_argument("--out")
    args = p.parse_args()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    only = set(args.only or ["drain", "delay", "scrape"])
    backends = ["postgres", "sqlite"] if args.backend == "both" else [args.backend]
    lines = []

    def row(backend: str, metric: str, **values) -> None:
        r = {"bench": "events", "backend": backend, "metric": metric, **values}
        r |= {"conveyor": commit(), "version": conveyor.__version__}
        emit(r, args.out)

    for b in backends:
        if "drain" in only:
            off, on = [], []
            for i in range(args.runs):
                say(f"{b}: drain {args.n:,} jobs, events off (run {i + 1})")
                off.append(drain(b, args.n, events=False)[0])
                if args.no_events:
                    continue
                say(f"{b}: drain {args.n:,} jobs, one SSE client following (run {i + 1})")
                rate, seen = drain(b, args.n, events=True)
                on.append(rate)
                say(f"{b}:   the client read {seen:,} events")
            row(b, "drain_events_off", jobs_per_s=[round(x) for x in off], n=args.n)
            if args.no_events:
                lines.append(
                    f"| {b} | drain, jobs/s, no events (mean of {args.runs}) | "
                    f"{sum(off) / len(off):,.0f} |"
                )
                continue
            row(b, "drain_events_on", jobs_per_s=[round(x) for x in on], n=args.n)
            ratio = (sum(on) / len(on)) / (sum(off) / len(off))
            lines.append(
                f"| {b} | drain, jobs/s, events off / on (mean of {args.runs}) | "
                f"{sum(off) / len(off):,.0f} / {sum(on) / len(on):,.0f} ({ratio:.2f}x) |"
            )
        if "delay" in only:
            say(f"{b}: event delay, 500 jobs at 50/s")
            d = event_delay(b)
            row(b, "event_delay_ms", p50=round(pct(d, 50), 1), p99=round(pct(d, 99), 1), n=len(d))
            lines.append(
                f"| {b} | completion to SSE client, ms, p50 / p99 ({len(d)} jobs) | "
                f"{pct(d, 50):.1f} / {pct(d, 99):.1f} |"
            )
        if "scrape" in only:
            say(f"{b}: /metrics on {args.rows:,} jobs")
            t = scrape_1m(b, args.rows)
            row(b, "scrape_ms", p50=round(pct(t, 50), 1), max=round(max(t), 1), rows=args.rows)
            lines.append(
                f"| {b} | GET /metrics on {args.rows:,} jobs, ms, p50 / max (20 scrapes) | "
                f"{pct(t, 50):.1f} / {max(t):.1f} |"
            )
    print("| backend | measure | value |\n|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
