"""Batch benchmark: creating batches, asking a big one for progress, closing them.

Its own script (not the shared peer harness); results are appended as JSON lines
(one per measurement) to ``--out``, and ``bench/report.py --batches FILE`` turns
them into the "Batches" section of bench/RESULTS.md. ``bench/run.sh`` (``make
bench``) runs it after the peer runs. Three measurements:

1. create: ``task.batch(items)`` of ``--create-n`` (10,000) items, items/s, median
   of ``--create-runs`` (3) runs, each into a fresh database (PostgreSQL database
   ``bench_batches`` dropped and created, or a new SQLite file). ``task.send_many``
   of the same items, also into a fresh database, is measured beside it.
2. progress (PostgreSQL only): a batch of ``--progress-n`` (100,000) items in two
   fresh databases: in the first with no worker (all pending); in the second after
   an in-process Worker (no-op handler, concurrency 100) drained at least half of
   it and was stopped. In each state, after ANALYZE: ``--progress-calls`` (50)
   calls of ``batch.progress()`` (the batch's counts from the rollup the triggers
   keep, schema v16, plus the re-read of the batch row) and as many of the counts
   alone (``backend.batch_progress``), median and p95 ms; and EXPLAIN (ANALYZE) of
   the backend's own query text: the custom plan (literal id) and the generic plan
   a prepared statement may switch to (psycopg prepares after 5 executions).
   Also a finalize probe (see ``finalize_probe``): the worker's outcome write timed
   on the first database after its all-pending ANALYZE, and on the second before
   any ANALYZE. The worker drains the second one, not the first: on the first the
   outcome write takes a bad generic plan and a worker crawls (see the probe).
3. close delay: ``--close-batches`` (20) batches of ``--close-items`` (20) no-op
   jobs, created one every ``--close-gap-s`` (0.15 s) while one in-process Worker
   (flow_poll_s at its default) runs; per batch, delay = batch.finished_at (set by
   the aggregator when it closes the batch) - the latest finished_at of its jobs.
   p50/p99/max ms. On PostgreSQL the aggregator is woken by NOTIFY "@flow"; on
   SQLite by the PRAGMA data_version watcher or its poll. Both timestamps come from
   the same clock (the server's now() of each transaction on PostgreSQL, the worker
   process's time.time() on SQLite).

    PEERBENCH_PG=postgresql://postgres@127.0.0.1:5432 \\
        /tmp/peerbench/venv/bin/python bench/bench_batches.py --out /tmp/peerbench/b.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg
from _bench import PG_BASE, SCRATCH, commit, db_url, emit, fresh_database, pct

import conveyor
from conveyor import Conveyor
from conveyor.backends.postgres.backend import Q as PG_QUERIES
from conveyor.runtime.worker import Worker, WorkerConfig

PG_DB = "bench_batches"
SQLITE_FILE = SCRATCH / "bench_batches.db"
QUEUE = "bench_batches"
DONE = ("succeeded", "failed", "cancelled")


# -- helpers ----------------------------------------------------------------------------


def url(backend: str) -> str:
    return db_url(backend, PG_DB, SQLITE_FILE)


def fresh(backend: str) -> None:
    fresh_database(backend, PG_DB, SQLITE_FILE)


def say(msg: str) -> None:
    print(f"bench_batches: {msg}", file=sys.stderr, flush=True)


def summary_ms(values_ms: list[float]) -> dict:
    return {
        "n": len(values_ms),
        "p50_ms": round(pct(values_ms, 50), 2),
        "p95_ms": round(pct(values_ms, 95), 2),
        "p99_ms": round(pct(values_ms, 99), 2),
        "max_ms": round(max(values_ms), 2),
        "mean_ms": round(statistics.fmean(values_ms), 2),
    }


def make_app(backend: str):
    """A migrated app with the one no-op task (plus a warmed-up connection)."""
    app = Conveyor(url(backend))

    async def noop(i: int) -> None:
        return None

    task = app.task(name="batch_noop", queue=QUEUE)(noop)
    app.migrate()
    app.counts()  # first round trip outside any timed section
    return app, task


class ThreadWorker:
    """A Worker running its own event loop in a thread of this process."""

    def __init__(self, backend: str, **options):
        self.app, _ = make_app(backend)
        self.worker = Worker(self.app, queues=[QUEUE], **options)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="bench-worker", daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run(install_signals=False)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def __enter__(self) -> ThreadWorker:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.worker.stop()
        self.thread.join(30)
        if self.thread.is_alive():
            say("worker did not stop within 30 s")
        self.app.close()
        if self.error is not None:
            raise RuntimeError(f"worker thread failed: {self.error!r}") from self.error


# -- 1. creating a batch ------------------------------------------------------------------
def bench_create(backend: str, n: int, runs: int, base: dict, out: str | None) -> None:
    items = [(i,) for i in range(n)]
    rates: dict[str, list[float]] = {"batch": [], "send_many": []}
    for _ in range(runs):
        for how in ("batch", "send_many"):
            fresh(backend)
            app, task = make_app(backend)
            try:
                t0 = time.perf_counter()
                if how == "batch":
                    b = task.batch(items, name="create")
                    assert b.total == n, b.total
                else:
                    task.send_many(items)
                rates[how].append(n / (time.perf_counter() - t0))
            finally:
                app.close()
    row = {
        **base,
        "measure": "create",
        "backend": backend,
        "n": n,
        "runs": runs,
        "items_s": round(statistics.median(rates["batch"]), 1),
        "items_s_runs": [round(r, 1) for r in rates["batch"]],
        "send_many_items_s": round(statistics.median(rates["send_many"]), 1),
        "send_many_items_s_runs": [round(r, 1) for r in rates["send_many"]],
    }
    say(
        f"{backend} create {n:,}: batch {row['items_s']:,.0f} items/s, "
        f"send_many {row['send_many_items_s']:,.0f} items/s"
    )
    emit(row, out)


# -- 2. progress of a big batch (PostgreSQL) ----------------------------------------------
def explain(batch_id: int) -> dict:
    """EXPLAIN (ANALYZE) of the backend's own batch_progress text: the custom plan
    (literal id) and the generic plan a prepared statement can switch to, in a
    session set as Conveyor's own are (jit=off)."""
    query = PG_QUERIES["batch_progress"]
    body = "\n".join(ln for ln in query.splitlines() if not ln.lstrip().startswith("--"))
    plans: dict = {}
    with psycopg.connect(f"{PG_BASE}/{PG_DB}", autocommit=True, options="-c jit=off") as conn:
        cur = psycopg.ClientCursor(conn)  # the id goes in as a literal: a custom plan
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + query, {"id": batch_id})
        plans["custom"] = [r[0] for r in cur.fetchall()]
        generic = body.replace("%(id)s", "$1")
        conn.execute(f"PREPARE bench_progress(bigint) AS {generic}")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_progress({batch_id})")
        plans["generic"] = [r[0] for r in rows.fetchall()]
        conn.execute("RESET plan_cache_mode")
    return {k: {"plan": v, "summary": plan_summary(v)} for k, v in plans.items()}


def plan_summary(lines: list[str]) -> str:
    """The scan node (with its index), its heap fetches, and the execution time."""
    scan = next((ln.strip().lstrip("-> ").strip() for ln in lines if " Scan " in ln), "?")
    scan = scan.split("  (")[0]
    fetches = next((ln.strip() for ln in lines if "Heap Fetches" in ln), "")
    took = next((ln.strip() for ln in lines if ln.startswith("Execution Time")), "")
    return "; ".join(s for s in (scan, fetches, took) if s)


def time_progress(app, batch, calls: int) -> dict:
    def timed(fn) -> list[float]:
        for _ in range(3):  # warm-up, not counted
            fn()
        ms = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t0) * 1000)
        return ms

    handle = timed(batch.progress)
    query = timed(lambda: app.backend.batch_progress(batch_id=batch.id))
    return {"progress": summary_ms(handle), "query": summary_ms(query)}


def analyze() -> None:
    with psycopg.connect(f"{PG_BASE}/{PG_DB}", autocommit=True) as conn:
        conn.execute("ANALYZE conveyor_jobs")
        conn.execute("ANALYZE conveyor_batches")


def drain_half(app, batch_id: int, n: int, timeout_s: float) -> dict:
    """Run a no-op Worker (concurrency 100) until half the batch is finished (or
    the timeout), then stop it: running jobs finish and their outcomes are written."""
    t0 = time.perf_counter()
    with ThreadWorker("postgres", concurrency=100, fetch_batch=100):
        deadline = time.monotonic() + timeout_s
        while True:
            done = sum(app.backend.batch_progress(batch_id=batch_id).get(s, 0) for s in DONE)
            if done * 2 >= n or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        ran_s = time.perf_counter() - t0
    total_s = time.perf_counter() - t0
    done = sum(app.backend.batch_progress(batch_id=batch_id).get(s, 0) for s in DONE)
    return {
        "done": done,
        "ran_s": round(ran_s, 2),
        "stop_s": round(total_s - ran_s, 2),
        "jobs_s": round(done / total_s, 1),
    }


def finalize_probe(app, task, running: int, chunk: int, calls: int) -> dict:
    """A worker's steady state, timed through the backend seam: ``running`` jobs
    claimed; then ``calls`` times, the outcomes (succeeded) of the oldest ``chunk``
    are written with one job_finalize_many and ``chunk`` more are claimed. psycopg
    prepares a statement on its 6th execution and PostgreSQL may switch a prepared
    statement to its generic plan after 5 more, so calls 1-10 and 11+ are reported
    apart. The jobs still claimed at the end are finished (untimed)."""
    from conveyor.runtime.executor import Run, classify

    def claim(k: int) -> list:
        return app.backend.job_claim(queues=[QUEUE], worker_id="bench-probe", limit=k)

    def write(jobs: list) -> None:
        outcomes = [classify(task, j, Run()) for j in jobs]
        written = app.backend.job_finalize_many(worker_id="bench-probe", outcomes=outcomes)
        assert len(written) == len(outcomes), (len(written), len(outcomes))

    held = claim(running)
    ms = []
    for _ in range(calls):
        head, held = held[:chunk], held[chunk:]
        t0 = time.perf_counter()
        write(head)
        ms.append((time.perf_counter() - t0) * 1000)
        held += claim(chunk)
    for i in range(0, len(held), chunk):
        write(held[i : i + chunk])
    return {
        "running": running,
        "chunk": chunk,
        "calls_1_10": summary_ms(ms[:10]),
        "calls_11_on": summary_ms(ms[10:]) if len(ms) > 10 else None,
        "calls_ms": [round(x, 2) for x in ms],
    }


def bench_progress(n: int, calls: int, probe_running: int, base: dict, out: str | None) -> None:
    """Two fresh databases: one for the all-pending state (ANALYZEd with every job
    pending, as auto-analyze would after a bulk enqueue), one drained to half by a
    worker before any ANALYZE (a worker on the first one crawls: see finalize_probe,
    which runs on both, on the first after its ANALYZE, on the second before it)."""
    backend = "postgres"

    def setup():
        fresh(backend)
        app, task = make_app(backend)
        t0 = time.perf_counter()
        batch = task.batch([(i,) for i in range(n)], name="progress")
        made_s = time.perf_counter() - t0
        say(f"progress: created the {n:,}-job batch in {made_s:.1f}s")
        return app, task, batch, made_s

    def probe(app, task, label: str) -> None:
        p = finalize_probe(app, task, probe_running, 100, 40)
        late = p["calls_11_on"] or {}
        say(
            f"progress: finalize probe ({label}), {p['running']} running, {p['chunk']} "
            f"outcomes per call: p50 calls 1-10 {p['calls_1_10']['p50_ms']} ms, "
            f"calls 11+ {late.get('p50_ms')} ms (max {late.get('max_ms')})"
        )
        emit({**base, "measure": "finalize_probe", "backend": backend, "stats": label, **p}, out)

    def measure(app, batch, made_s: float, state: str, drained: dict | None) -> None:
        analyze()
        counts = app.backend.batch_progress(batch_id=batch.id)
        timing = time_progress(app, batch, calls)
        plans = explain(batch.id)
        row = {
            **base,
            "measure": "progress",
            "backend": backend,
            "n": n,
            "state": state,
            "counts": counts,
            "calls": calls,
            **timing,
            "explain": plans,
            "create_s": round(made_s, 2),
            "drain": drained,
        }
        say(
            f"progress [{state}] {counts}: progress() p50 {timing['progress']['p50_ms']} "
            f"p95 {timing['progress']['p95_ms']} ms; query p50 {timing['query']['p50_ms']} ms; "
            + "; ".join(f"{k} plan: {v['summary']}" for k, v in plans.items())
        )
        emit(row, out)

    app, task, batch, made_s = setup()
    try:
        measure(app, batch, made_s, "all pending", None)  # ANALYZEs with every job pending
        probe(app, task, "after ANALYZE with every job pending")
    finally:
        app.close()
    app, task, batch, made_s = setup()
    try:
        probe(app, task, "no statistics yet")
        drained = drain_half(app, batch.id, n, 60.0)
        say(f"progress: drained {drained}")
        measure(app, batch, made_s, "about half done", drained)
    finally:
        app.close()


# -- 3. close delay -------------------------------------------------------------------------
def bench_close(
    backend: str, batches: int, items: int, gap_s: float, base: dict, out: str | None
) -> None:
    fresh(backend)
    app, task = make_app(backend)
    poll_s = WorkerConfig().flow_poll_s
    made = []
    try:
        with ThreadWorker(backend, concurrency=20):
            time.sleep(0.5)  # the worker has started, registered, and taken the flow lease
            next_at = time.monotonic()
            for k in range(batches):
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                made.append(task.batch([(i,) for i in range(items)], name=f"close-{k}"))
                next_at += gap_s
            deadline = time.monotonic() + 5 * poll_s + 10
            while time.monotonic() < deadline:
                states = [app.get_batch(b.id) for b in made]
                if all(b.finished for b in states):
                    break
                time.sleep(0.05)
            else:
                open_ = [b.id for b in states if not b.finished]
                raise RuntimeError(f"{backend}: batches {open_} still open after the deadline")
        delays, spans = [], []
        for b in states:
            jobs = app.backend.batch_jobs(batch_id=b.id)
            last = max(j.finished_at for j in jobs)
            delays.append((b.record.finished_at - last).total_seconds() * 1000)
            spans.append((b.record.finished_at - b.record.created_at).total_seconds() * 1000)
            assert b.state == "succeeded", (b.id, b.state, b.counts)
    finally:
        app.close()
    goal_ms = 1000.0 if backend == "postgres" else poll_s * 1000
    s = summary_ms(delays)
    row = {
        **base,
        "measure": "close_delay",
        "backend": backend,
        "batches": batches,
        "items": items,
        "gap_s": gap_s,
        "flow_poll_s": poll_s,
        "goal_ms": goal_ms,
        "met": s["max_ms"] < goal_ms,
        "delay": s,
        "delays_ms": [round(d, 2) for d in delays],
        "created_to_closed": summary_ms(spans),
    }
    say(
        f"{backend} close delay over {batches} batches: p50 {s['p50_ms']} p99 {s['p99_ms']} "
        f"max {s['max_ms']} ms (goal < {goal_ms:.0f} ms)"
    )
    emit(row, out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backends", default="postgres,sqlite", help="comma-separated")
    p.add_argument("--phases", default="create,progress,close", help="comma-separated")
    p.add_argument("--create-n", type=int, default=10_000)
    p.add_argument("--create-runs", type=int, default=3)
    p.add_argument("--progress-n", type=int, default=100_000)
    p.add_argument("--progress-calls", type=int, default=50)
    p.add_argument(
        "--probe-running",
        type=int,
        default=500,
        help="jobs the finalize probe keeps claimed (outcomes written 100 per call)",
    )
    p.add_argument("--close-batches", type=int, default=20)
    p.add_argument("--close-items", type=int, default=20)
    p.add_argument("--close-gap-s", type=float, default=0.15)
    p.add_argument("--out", default=None, help="append JSON lines here")
    p.add_argument("--markdown", action="store_true", help="print the Markdown section at the end")
    args = p.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    phases = {x.strip() for x in args.phases.split(",") if x.strip()}
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")

    base = {
        "library": "conveyor",
        "version": conveyor.__version__,
        "bench": "batches",
        "settings": {"commit": commit(), "pg": PG_BASE, "sqlite_file": str(SQLITE_FILE)},
    }
    rows_from = Path(args.out).stat().st_size if args.out and Path(args.out).exists() else 0
    t0 = time.monotonic()
    if "create" in phases:
        for backend in backends:
            bench_create(backend, args.create_n, args.create_runs, base, args.out)
    if "progress" in phases and "postgres" in backends:
        bench_progress(args.progress_n, args.progress_calls, args.probe_running, base, args.out)
    if "close" in phases:
        for backend in backends:
            bench_close(
                backend, args.close_batches, args.close_items, args.close_gap_s, base, args.out
            )
    say(f"done in {time.monotonic() - t0:.0f}s")
    if args.markdown and args.out:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import report

        with open(args.out) as f:
            f.seek(rows_from)
            rows = [json.loads(ln) for ln in f if ln.strip().startswith("{")]
        print("\n".join(report.batches_section(rows, args.out)), file=sys.stderr)


if __name__ == "__main__":
    main()
