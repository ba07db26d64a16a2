"""Concurrency-limit benchmark: what per-key and queue-wide limits cost a drain.

Its own script (not the shared peer harness); results are appended as JSON lines
(one per drain) to ``--out``, and ``bench/report.py --limits FILE`` turns them into
the "Concurrency limits" section of bench/RESULTS.md. ``bench/run.sh`` (``make
bench``) runs it after the batch benchmark.

For each backend (PostgreSQL, SQLite), ``--rounds`` (3) times, and each configuration
in a round, in a fresh database
(PostgreSQL database ``bench_limits`` dropped and created, or a new SQLite file):
``--n`` (20,000) no-op async jobs ``noop(i, user)`` are enqueued with
``task.send_many`` (chunks of 1,000), the limit (if any) is set, then ONE worker
process (``Worker(app, queues=[...], concurrency=100, fetch_batch=100)``, started
after the enqueue) drains them. Drain throughput is the shared harness's phase b
definition: jobs / (last handler end - first handler start), both read with
``time.time()`` inside the worker process. Configurations:

- ``unlimited``: a plain task, no queue limit (the SKIP LOCKED fast path);
- ``keys1000``: ``concurrency_key="user", concurrency_limit=2`` with
  ``user = i % 1000``: the limit rarely binds, so this is the cost of the
  serialized, limit-aware claim itself;
- ``keys100``: ``concurrency_limit=1`` with ``user = i % 100``: binds, at most 100
  jobs running (the worker's own concurrency);
- ``queue50``: a plain task and ``app.set_queue_limit(queue, max_running=50)``.

Rate limits are not implemented in Conveyor yet, so there is no rate-limit
configuration (and no such column in the report).

Where the time goes: inside the worker process the backend's
``job_claim`` and ``job_finalize_many`` are wrapped (on the instance,
not in src/) to count calls, empty claims, jobs per claim and time spent. A
sampler in the parent process (``--sample-s``, 0.1 s; 0 turns it off) reads the
running counts from the database (in the queue, and the largest per key) to check
the limits held, as far as 0.1 s snapshots can tell.

    PEERBENCH_PG=postgresql://postgres@127.0.0.1:5432 \\
        /tmp/peerbench/venv/bin/python bench/bench_limits.py --out /tmp/peerbench/l.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
from _bench import PG_BASE, SCRATCH, commit, db_url, emit, fresh_database, pct

import conveyor
from conveyor import Conveyor
from conveyor.backends.sql.logic import KEY_LOCKS_MAX
from conveyor.runtime.worker import Worker

PG_DB = "bench_limits"
SQLITE_FILE = SCRATCH / "bench_limits.db"
QUEUE = "bench_limits"
TASK = "limits_noop"
CHUNK = 1000

#: name -> (keys, concurrency_limit, queue max_running, description)
CONFIGS: dict[str, tuple[int | None, int | None, int | None, str]] = {
    "unlimited": (None, None, None, "unlimited (fast path)"),
    "keys1000": (1000, 2, None, "per-key limit 2, 1,000 keys (rarely binds)"),
    "keys100": (100, 1, None, "per-key limit 1, 100 keys (binds: <= 100 running)"),
    "queue50": (None, None, 50, "queue limit max_running=50"),
    "queue1000": (None, None, 1000, "queue limit max_running=1,000 (never binds)"),
}


# -- helpers ----------------------------------------------------------------------------
# The session settings Conveyor's own PostgreSQL connections use (backends/postgres
# _configure), set at connect time so the rollbacks between plans keep them.
CONVEYOR_SESSION = "-c jit=off"


def url(backend: str) -> str:
    return db_url(backend, PG_DB, SQLITE_FILE)


def fresh(backend: str) -> None:
    fresh_database(backend, PG_DB, SQLITE_FILE)


def say(msg: str) -> None:
    print(f"bench_limits: {msg}", file=sys.stderr, flush=True)


def make_app(backend: str, config: str, handler=None):
    """The app with the one no-op task, registered as the configuration wants."""
    keys, limit, _, _ = CONFIGS[config]
    app = Conveyor(url(backend))

    async def noop(i: int, user: int) -> None:
        if handler is not None:
            handler()

    opts = {} if keys is None else {"concurrency_key": "user", "concurrency_limit": limit}
    task = app.task(name=TASK, queue=QUEUE, **opts)(noop)
    return app, task


def rate_limit_api() -> str:
    """The rate-limit parameters of ``app.task``, if it has any yet ("" if none)."""
    import inspect

    params = [p for p in inspect.signature(Conveyor.task).parameters if "rate" in p]
    return ", ".join(params)


# -- the worker process -------------------------------------------------------------------
class Meter:
    """Wraps one backend method on the instance: calls, rows, time spent."""

    def __init__(self, backend, name: str, rows_of):
        self.fn = getattr(backend, name)
        self.rows_of = rows_of
        self.calls: list[tuple[float, float, int, int | None]] = []  # start, end, rows, asked
        self.lock = threading.Lock()
        setattr(backend, name, self)

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        t1 = time.perf_counter()
        with self.lock:
            self.calls.append((t0, t1, self.rows_of(args, kwargs, out), kwargs.get("limit")))
        return out

    def summary(self) -> dict:
        if not self.calls:
            return {"calls": 0}
        calls = sorted(self.calls)
        ms = [(c[1] - c[0]) * 1000 for c in calls]
        rows = [c[2] for c in calls]
        out = {
            "calls": len(calls),
            "empty": sum(1 for r in rows if r == 0),
            "rows_mean": round(statistics.fmean(rows), 1),
            "total_s": round(sum(ms) / 1000, 3),
            "p50_ms": round(pct(ms, 50), 2),
            "p95_ms": round(pct(ms, 95), 2),
            "max_ms": round(max(ms), 2),
        }
        if calls[0][3] is not None:  # claims: the idle time before the next claim, by outcome
            gaps: dict[str, list[float]] = {"full": [], "short": [], "empty": []}
            for a, b in itertools.pairwise(calls):
                kind = "empty" if a[2] == 0 else "full" if a[2] >= (a[3] or 0) else "short"
                gaps[kind].append(max(0.0, b[0] - a[1]) * 1000)
            out["gap_after"] = {
                k: {
                    "n": len(v),
                    "total_s": round(sum(v) / 1000, 3),
                    "p50_ms": round(pct(v, 50), 1),
                    "max_ms": round(max(v), 1),
                }
                for k, v in gaps.items()
                if v
            }
        return out


async def worker_main(args) -> None:
    state = {"count": 0, "t_first": None, "t_last": None}
    worker: Worker | None = None

    def handle() -> None:
        now = time.time()
        if state["t_first"] is None:
            state["t_first"] = now
        state["count"] += 1
        state["t_last"] = now
        if state["count"] >= args.n and worker is not None:
            worker.stop()

    app, _ = make_app(args.backend, args.config, handle)
    fetch = Meter(app.backend, "job_claim", lambda a, k, out: len(out))
    final = Meter(app.backend, "job_finalize_many", lambda a, k, out: len(k.get("outcomes", ())))
    worker = Worker(app, queues=[QUEUE], concurrency=args.concurrency, fetch_batch=args.fetch_batch)

    async def deadline() -> None:
        await asyncio.sleep(args.timeout_s)
        state["timed_out"] = True
        worker.stop()

    guard = asyncio.get_running_loop().create_task(deadline())
    try:
        await worker.run_async()
    finally:
        guard.cancel()
        app.close()
    span = (state["t_last"] or 0) - (state["t_first"] or 0)
    Path(args.result_file).write_text(
        json.dumps(
            {
                **state,
                "span_s": span,
                "fetch": fetch.summary(),
                "finalize": final.summary(),
            }
        )
    )


# -- the parent: one drain ----------------------------------------------------------------
SAMPLE_SQL = (
    "SELECT (SELECT count(*) FROM conveyor_jobs WHERE state = 'running'),"
    " (SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM conveyor_jobs"
    "  WHERE state = 'running' AND concurrency_key IS NOT NULL GROUP BY concurrency_key) s),"
    " (SELECT count(*) FROM conveyor_jobs WHERE state = 'succeeded')"
)


class Sampler:
    """Polls the running counts in the database from the parent process."""

    def __init__(self, backend: str, every_s: float):
        self.backend = backend
        self.every_s = every_s
        self.samples: list[tuple[int, int, int]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _run(self) -> None:
        try:
            if self.backend == "postgres":
                conn = psycopg.connect(f"{PG_BASE}/{PG_DB}", autocommit=True)
                query = lambda: conn.execute(SAMPLE_SQL).fetchone()  # noqa: E731
            else:
                conn = sqlite3.connect(str(SQLITE_FILE), timeout=30)
                query = lambda: conn.execute(SAMPLE_SQL).fetchone()  # noqa: E731
            try:
                while not self._stop.wait(self.every_s):
                    self.samples.append(tuple(query()))
            finally:
                conn.close()
        except Exception as exc:  # a sampler failure must not lose the drain figure
            self.error = repr(exc)

    def __enter__(self) -> Sampler:
        if self.every_s > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(10)

    def summary(self) -> dict:
        busy = [s for s in self.samples if s[0] > 0]
        out: dict = {"samples": len(self.samples), "every_s": self.every_s}
        if self.error:
            out["error"] = self.error
        if busy:
            out["max_running"] = max(s[0] for s in busy)
            out["mean_running"] = round(statistics.fmean(s[0] for s in busy), 1)
            out["max_running_per_key"] = max(s[1] for s in busy)
        return out


def drain(backend: str, config: str, args, base: dict) -> dict:
    keys, limit, max_running, label = CONFIGS[config]
    fresh(backend)
    app, task = make_app(backend, config)
    try:
        app.migrate()
        items = [(i, i % keys if keys else 0) for i in range(args.n)]
        t0 = time.perf_counter()
        for start in range(0, args.n, CHUNK):
            task.send_many(items[start : start + CHUNK])
        enqueue_s = time.perf_counter() - t0
        if max_running is not None:
            app.set_queue_limit(QUEUE, max_running=max_running)
    finally:
        app.close()

    SCRATCH.mkdir(parents=True, exist_ok=True)
    rf = SCRATCH / f"bench_limits_{backend}_{config}.json"
    rf.unlink(missing_ok=True)
    err = Path(str(rf) + ".stderr")
    cmd = [
        sys.executable,
        __file__,
        "--role",
        "worker",
        "--backend",
        backend,
        "--config",
        config,
        "--n",
        str(args.n),
        "--concurrency",
        str(args.concurrency),
        "--fetch-batch",
        str(args.fetch_batch),
        "--timeout-s",
        str(args.timeout_s),
        "--result-file",
        str(rf),
    ]
    t0 = time.time()
    with Sampler(backend, args.sample_s) as sampler, open(err, "w") as errf:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf)
        try:
            rc = proc.wait(timeout=args.timeout_s + 60)
        except subprocess.TimeoutExpired:
            proc.kill()  # the worker we started, and only it
            rc = proc.wait()
    wall = time.time() - t0
    if not rf.exists():
        tail = err.read_text()[-2000:] if err.exists() else ""
        raise RuntimeError(f"{backend}/{config}: the worker (rc {rc}) wrote no result:\n{tail}")
    d = json.loads(rf.read_text())
    jobs_s = d["count"] / d["span_s"] if d["span_s"] > 0 else None
    row = {
        **base,
        "backend": backend,
        "config": config,
        "label": label,
        "n": args.n,
        "keys": keys,
        "concurrency_limit": limit,
        "max_running": max_running,
        "concurrency": args.concurrency,
        "fetch_batch": args.fetch_batch,
        "enqueue_jobs_s": round(args.n / enqueue_s, 1),
        "processed": d["count"],
        "timed_out": bool(d.get("timed_out")),
        "process_jobs_s": round(jobs_s, 1) if jobs_s else None,
        "process_span_s": round(d["span_s"], 3),
        "process_wall_s": round(wall, 2),
        "worker_rc": rc,
        "fetch": d["fetch"],
        "finalize": d["finalize"],
        "db_running": sampler.summary(),
    }
    f = d["fetch"]
    s = row["db_running"]
    say(
        f"{backend:8s} {config:9s}: {d['count']:,} jobs in {d['span_s']:.2f}s = "
        f"{(jobs_s or 0):,.0f} jobs/s{' (TIMED OUT)' if row['timed_out'] else ''}; "
        f"claims {f.get('calls', 0)} ({f.get('empty', 0)} empty, {f.get('rows_mean', 0)} "
        f"jobs each, p50 {f.get('p50_ms')} ms, {f.get('total_s')} s in all); running in db: "
        f"max {s.get('max_running')}, max per key {s.get('max_running_per_key')}"
    )
    return row


# -- the PostgreSQL claim plan -------------------------------------------------------------
def plan_summary(lines: list[str]) -> dict:
    """The parts of a keyed claim's plan that matter: the candidate scan (locks
    ``window`` rows), the join of the ranked candidates with the running counts per
    key, and the execution time."""
    out: dict = {}
    for i, ln in enumerate(lines):
        text = ln.strip().removeprefix("->").strip()
        if text.startswith("CTE cand") and i + 1 < len(lines):
            out["cand"] = lines[i + 1].strip().removeprefix("->").strip()
            scan = next((x for x in lines[i + 1 :] if " on conveyor_jobs" in x), "")
            out["cand_scan"] = scan.strip().removeprefix("->").strip().split("  (")[0]
        elif "Left Join" in text and "join" not in out:
            out["join"] = text
            removed = next(
                (x.strip() for x in lines[i + 1 : i + 4] if "Rows Removed by Join Filter" in x), ""
            )
            if removed:
                out["join_removed"] = removed
        elif text.startswith("Execution Time"):
            out["execution"] = text
    return out


def claim_plan(args, base: dict) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS) of the backend's own limited claim (the candidates
    and their key locks, then job_claim_keyed with their ids and keys) in the
    keys1000 setting, halfway: ``--n`` jobs over 1,000 keys enqueued, half of them
    claimed and finished through the backend, 100 held running (as a worker would),
    then the claim of 100 explained (window max(100, 10 x 100)) and rolled back:
    without statistics (as in the drain, on a fresh database) and after ANALYZE."""
    from conveyor.backends.postgres.backend import Q as PG_QUERIES
    from conveyor.runtime.executor import Run, classify

    fresh("postgres")
    app, task = make_app("postgres", "keys1000")
    plans: dict = {}
    try:
        app.migrate()
        keys = CONFIGS["keys1000"][0] or 1
        items = [(i, i % keys) for i in range(args.n)]
        for start in range(0, args.n, CHUNK):
            task.send_many(items[start : start + CHUNK])
        backend, done = app.backend, 0

        def claim(k: int) -> list:
            return backend.job_claim(queues=[QUEUE], worker_id="bench-plan", limit=k)

        while done < args.n // 2:
            jobs = claim(args.fetch_batch)
            if not jobs:
                break
            outcomes = [classify(task, j, Run()) for j in jobs]
            backend.job_finalize_many(worker_id="bench-plan", outcomes=outcomes)
            done += len(jobs)
        held = len(claim(args.fetch_batch))
        params = {
            "now": None,
            "queue": QUEUE,
            "worker_id": "bench-plan",
            "lease_s": None,
            "limit": args.fetch_batch,
            "max_running": None,
            "window": max(100, 10 * args.fetch_batch),  # as the backend passes it
            "identity": ["bench-plan"],
            "tasks": None,
            "schema_version": 10**6,
            "queue_rate": None,
            "queue_burst": None,
            "key_locks": KEY_LOCKS_MAX,
        }
        with psycopg.connect(f"{PG_BASE}/{PG_DB}", options=CONVEYOR_SESSION) as conn:
            cur = psycopg.ClientCursor(conn)
            for stats in ("no statistics (as in the drain)", "after ANALYZE"):
                if stats.startswith("after"):
                    conn.execute("ANALYZE conveyor_jobs")
                    conn.execute("ANALYZE conveyor_queues")
                    conn.commit()
                for _ in range(2):  # the second run is kept (warm cache)
                    # as the backend claims: the candidates and their key locks,
                    # then the claim that counts, by their ids
                    explain = "EXPLAIN (ANALYZE, BUFFERS) "
                    cur.execute(explain + PG_QUERIES["job_claim_candidates"], params)
                    picking = [r[0] for r in cur.fetchall()]
                    cur.execute(PG_QUERIES["job_claim_candidates"], params)
                    cands = cur.fetchall()  # id, rate_key, concurrency_key, its limit, .., ord
                    keyed = {
                        "ids": [r[0] for r in cands],
                        "keys": [r[2] for r in cands],
                        "limits": [r[3] for r in cands],
                        "ords": [r[5] for r in cands],
                    }
                    cur.execute(explain + PG_QUERIES["job_claim_keyed"], {**params, **keyed})
                    claiming = [r[0] for r in cur.fetchall()]
                    conn.rollback()  # EXPLAIN ANALYZE of an UPDATE claims: undo it
                summary = {**plan_summary(claiming), **plan_summary(picking)}
                took = [
                    plan_summary(x).get("execution", "?").split(": ")[-1]
                    for x in (picking, claiming)
                ]
                summary["execution"] = f"Execution Time: {took[0]} (candidates) + {took[1]} (claim)"
                lines = [*picking, "", *claiming]
                plans[stats] = {"summary": summary, "plan": lines}
    finally:
        app.close()
    row = {
        **base,
        "measure": "claim_plan",
        "backend": "postgres",
        "config": "keys1000",
        "n": args.n,
        "finished": done,
        "held_running": held,
        "plans": plans,
    }
    for stats, pl in plans.items():
        say(f"claim plan, keys1000, {done:,} finished, {held} running, {stats}: {pl['summary']}")
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backends", default="postgres,sqlite", help="comma-separated")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated")
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="each round drains every configuration once; the report takes the median of "
        "the rounds' ratios to the same round's unlimited drain (a machine's speed drifts)",
    )
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--fetch-batch", type=int, default=100)
    p.add_argument("--timeout-s", type=float, default=40.0, help="per drain; reported if hit")
    p.add_argument("--sample-s", type=float, default=0.1, help="db running-count sampler")
    p.add_argument(
        "--no-plan", action="store_true", help="skip the EXPLAIN of the PostgreSQL limited claim"
    )
    p.add_argument("--out", default=None, help="append JSON lines here")
    p.add_argument("--markdown", action="store_true", help="print the Markdown section at the end")
    # the worker process
    p.add_argument("--role", choices=["main", "worker"], default="main", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    if args.role == "worker":
        asyncio.run(worker_main(args))
        return

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown configuration(s) {unknown}; known: {list(CONFIGS)}")
    rate = rate_limit_api()
    base = {
        "library": "conveyor",
        "version": conveyor.__version__,
        "bench": "limits",
        "settings": {
            "commit": commit(),
            "pg": PG_BASE,
            "sqlite_file": str(SQLITE_FILE),
            "rate_limits": f"app.task has {rate} (not benchmarked)" if rate else "not implemented",
        },
    }
    if rate:
        say(f"app.task now takes {rate}: rate limits exist but are not benchmarked here yet")
    else:
        say("rate limits are not implemented in Conveyor yet: no rate-limit configuration")
    rows_from = Path(args.out).stat().st_size if args.out and Path(args.out).exists() else 0
    t0 = time.monotonic()
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    for backend in backends:
        for round_no in range(1, args.rounds + 1):
            for config in configs:
                row = drain(backend, config, args, base)
                emit({**row, "measure": "drain", "round": round_no}, args.out)
        if backend == "postgres" and not args.no_plan:
            emit(claim_plan(args, base), args.out)
    say(f"done in {time.monotonic() - t0:.0f}s")
    if args.markdown and args.out:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import report

        with open(args.out) as f:
            f.seek(rows_from)
            rows = [json.loads(ln) for ln in f if ln.strip().startswith("{")]
        print("\n".join(report.limits_section(rows, args.out)), file=sys.stderr)


if __name__ == "__main__":
    main()
