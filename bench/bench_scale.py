"""Scale with the work, not with the table (issue 13, goals 6-8), as users run it.

Every drain is real ``conveyor worker --burst`` processes with the CLI's defaults
on ``bench/scale_app.py``; the rate is jobs / (last finished_at - first
started_at), read from the jobs themselves.

  workers   1, 2 and 4 worker processes on one queue, on an empty table and with
            1,000,000 jobs waiting in another queue; PostgreSQL's wait events
            sampled every 50 ms during each run (a claim waiting on another
            claim would show as a Lock wait).
  finished  drain with 10,000,000 finished jobs kept vs the same database before
            they were added, and the reads that status, the server and the
            dashboard make (counts, oldest waiting, first pages, batch
            progress), p50/max over 20 calls each.
  memory    one worker's RSS over 1,000,000 jobs (sampled every second).
  churn     PostgreSQL with autovacuum off on Conveyor's tables: rounds of
            enqueue + drain (one worker) + delete, the dead rows left in place;
            with the leader's tidying (VACUUM past 50,000 dead rows) and
            without it (vacuum_dead_rows=None), each on a fresh database.

    .venv/bin/python bench/bench_scale.py --phases workers,finished,memory --out /tmp/scale.jsonl
    .venv/bin/python bench/bench_scale.py --phases churn --n 20000 --rounds 12
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
from _bench import REPO, SCRATCH, commit, db_url, emit, fresh_database

import conveyor
from conveyor import Conveyor

PG_DB = "bench_scale"
SQLITE_FILE = SCRATCH / "bench_scale.db"
QUEUE = "bench_scale"
CHUNK = 10_000


def say(msg: str) -> None:
    print(f"bench_scale: {msg}", file=sys.stderr, flush=True)


def worker(url: str, **extra_env: str) -> subprocess.Popen:
    env = {
        **os.environ,
        **extra_env,
        "CONVEYOR_DATABASE_URL": url,
        "PYTHONPATH": f"{Path(conveyor.__file__).parents[1]}{os.pathsep}{REPO / 'bench'}",
    }
    cmd = [sys.executable, "-m", "conveyor.cli.main", "worker", "--app", "scale_app:app"]
    cmd += ["--queues", QUEUE, "--log-level", "warning", "--burst"]
    return subprocess.Popen(cmd, cwd=REPO, env=env)


def enqueue(app: Conveyor, n: int, queue: str) -> None:
    for start in range(0, n, CHUNK):
        items = [(i,) for i in range(start, min(n, start + CHUNK))]
        app.enqueue_many("noop", items, queue=queue)


def span_rate(backend: str, url: str, n: int) -> float:
    if backend == "postgres":
        with psycopg.connect(url) as c:
            row = c.execute(
                "SELECT extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at)),"
                " count(*) FILTER (WHERE state = 'succeeded') FROM conveyor_jobs WHERE queue = %s",
                (QUEUE,),
            ).fetchone()
    else:
        with sqlite3.connect(url.removeprefix("sqlite:///")) as c:
            row = c.execute(
                "SELECT min(started_at), max(finished_at), sum(state = 'succeeded')"
                " FROM conveyor_jobs WHERE queue = ?",
                (QUEUE,),
            ).fetchone()
    first, last, done = row
    if int(done) != n:
        raise SystemExit(f"only {done} of {n} jobs succeeded")
    return n / (float(last) - float(first))


def clear_queue(backend: str, url: str) -> None:
    if backend == "postgres":
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("DELETE FROM conveyor_jobs WHERE queue = %s", (QUEUE,))
            c.execute("VACUUM ANALYZE conveyor_jobs")
    else:
        with sqlite3.connect(url.removeprefix("sqlite:///")) as c:
            c.execute("DELETE FROM conveyor_jobs WHERE queue = ?", (QUEUE,))


class WaitSampler(threading.Thread):
    """Counts PostgreSQL wait events of this database's active sessions."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.samples = 0
        self.waits: Counter[str] = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as c:
            while not self.stop.is_set():
                rows = c.execute(
                    "SELECT coalesce(wait_event_type, 'CPU'), coalesce(wait_event, '-'),"
                    " left(query, 40) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND state = 'active' AND pid <> pg_backend_pid()"
                ).fetchall()
                self.samples += 1
                for kind, event, query in rows:
                    key = f"{kind}:{event}"
                    if kind == "Lock":
                        key += f" ({query.strip()})"
                    self.waits[key] += 1
                time.sleep(0.05)


def drain(backend: str, url: str, n: int, processes: int) -> dict:
    app = Conveyor(url)
    enqueue(app, n, QUEUE)
    app.close()
    sampler = WaitSampler(url) if backend == "postgres" else None
    if sampler:
        sampler.start()
    workers = [worker(url) for _ in range(processes)]
    for w in workers:
        if w.wait(900) != 0:
            raise SystemExit(f"a worker exited with {w.returncode}")
    row: dict = {"rate": round(span_rate(backend, url, n))}
    if sampler:
        sampler.stop.set()
        sampler.join()
        row["samples"] = sampler.samples
        row["waits"] = dict(sampler.waits.most_common(8))
    clear_queue(backend, url)
    return row


def phase_workers(backend: str, n: int, rounds: int, waiting: int, out: str | None) -> None:
    for table in ("empty", f"{waiting:,} waiting"):
        fresh_database(backend, PG_DB, SQLITE_FILE)
        url = db_url(backend, PG_DB, SQLITE_FILE)
        app = Conveyor(url)
        app.migrate()
        if table != "empty":
            say(f"enqueueing {waiting:,} jobs into another queue")
            enqueue(app, waiting, "parked")
        app.close()
        for r in range(rounds):
            order = [1, 2, 4] if r % 2 == 0 else [4, 2, 1]
            for k in order:
                say(f"{backend} {table}: {k} worker(s), round {r + 1}")
                row = drain(backend, url, n, k)
                emit(
                    {
                        "bench": "scale.workers",
                        "backend": backend,
                        "table": table,
                        "processes": k,
                        "jobs": n,
                        "round": r + 1,
                        **row,
                        "commit": commit(),
                    },
                    out,
                )


def timed(fn, calls: int = 20) -> dict:
    fn()  # warm
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2)}


def reads(app: Conveyor, batch_id: int) -> dict:
    return {
        "counts (status)": timed(app.counts),
        "oldest waiting": timed(app.oldest_waiting),
        "open batches": timed(app.open_batches),
        "jobs page 1": timed(lambda: app.list_jobs(limit=50)),
        "failed jobs page 1": timed(lambda: app.list_jobs(limit=50, state="failed")),
        "count by task": timed(lambda: app.count_jobs(task="noop")),
        "batch progress (10k)": timed(lambda: app.batch_progress(batch_id)),
    }


def add_finished(url: str, total: int) -> None:
    step = 1_000_000
    with psycopg.connect(url, autocommit=True) as c:
        for start in range(0, total, step):
            end = min(start + step, total)
            say(f"adding finished jobs {start:,}..{end:,}")
            c.execute(
                "INSERT INTO conveyor_jobs (queue, task, args, state, priority, attempt,"
                " max_attempts, created_at, scheduled_at, started_at, finished_at, lease_owner)"
                " SELECT 'history', 'old_task', jsonb_build_object('args', jsonb_build_array(g)),"
                " 'succeeded', 0, 1, 1,"
                " now() - interval '2 days', now() - interval '2 days',"
                " now() - interval '2 days', now() - interval '2 days', 'w'"
                " FROM generate_series(%s::bigint, %s::bigint) g",
                (start, end - 1),
            )
        c.execute("VACUUM ANALYZE conveyor_jobs")


def phase_finished(n: int, rounds: int, total: int, out: str | None) -> None:
    backend = "postgres"
    fresh_database(backend, PG_DB, SQLITE_FILE)
    url = db_url(backend, PG_DB, SQLITE_FILE)
    app = Conveyor(url)
    app.migrate()

    def noop(i: int) -> None:
        return None

    task = app.task(queue=QUEUE)(noop)
    batch = task.batch([(i,) for i in range(10_000)], name="scale")
    with psycopg.connect(url, autocommit=True) as c:  # a finished batch, as history
        c.execute("UPDATE conveyor_jobs SET queue = 'history' WHERE batch_id = %s", (batch.id,))
    for label in ("before", f"{total:,} finished"):
        if label != "before":
            add_finished(url, total)
        emit(
            {
                "bench": "scale.reads",
                "backend": backend,
                "table": label,
                **reads(app, batch.id),
                "commit": commit(),
            },
            out,
        )
        for r in range(rounds):
            say(f"{label}: drain round {r + 1}")
            row = drain(backend, url, n, 1)
            emit(
                {
                    "bench": "scale.finished",
                    "backend": backend,
                    "table": label,
                    "jobs": n,
                    "round": r + 1,
                    **row,
                    "commit": commit(),
                },
                out,
            )
    app.close()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def phase_memory(backend: str, total: int, out: str | None) -> None:
    fresh_database(backend, PG_DB, SQLITE_FILE)
    url = db_url(backend, PG_DB, SQLITE_FILE)
    app = Conveyor(url)
    app.migrate()
    say(f"enqueueing {total:,} jobs")
    enqueue(app, total, QUEUE)
    w = worker(url)
    samples: list[tuple[float, int, int]] = []  # (seconds, jobs left, rss KiB)
    t0 = time.monotonic()
    while w.poll() is None:
        left = sum(c.count for c in app.counts() if c.queue == QUEUE and c.state == "available")
        try:
            samples.append((time.monotonic() - t0, left, rss_kib(w.pid)))
        except FileNotFoundError:
            break
        time.sleep(1)
    app.close()
    if w.returncode != 0:
        raise SystemExit(f"the worker exited with {w.returncode}")

    def at(fraction: float) -> int:
        done = [s for s in samples if total - s[1] >= fraction * total]
        return done[0][2] if done else samples[-1][2]

    emit(
        {
            "bench": "scale.memory",
            "backend": backend,
            "jobs": total,
            "rss_mib_at_1pct": round(at(0.01) / 1024, 1),
            "rss_mib_at_50pct": round(at(0.5) / 1024, 1),
            "rss_mib_end": round(samples[-1][2] / 1024, 1),
            "rss_mib_max": round(max(s[2] for s in samples) / 1024, 1),
            "seconds": round(samples[-1][0]),
            "commit": commit(),
        },
        out,
    )


def phase_churn(n: int, rounds: int, out: str | None) -> None:
    for tidy in ("on", "off"):
        fresh_database("postgres", PG_DB, SQLITE_FILE)
        url = db_url("postgres", PG_DB, SQLITE_FILE)
        app = Conveyor(url)
        app.migrate()
        with psycopg.connect(url, autocommit=True) as c:
            tables = c.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'conveyor%'"
                " AND schemaname = current_schema()"
            ).fetchall()
            for (table,) in tables:
                c.execute(f'ALTER TABLE "{table}" SET (autovacuum_enabled = false)')
        rates = []
        for r in range(rounds):
            enqueue(app, n, QUEUE)
            w = worker(url, SCALE_VACUUM=tidy)
            if w.wait(900) != 0:
                raise SystemExit(f"a worker exited with {w.returncode}")
            rates.append(round(span_rate("postgres", url, n)))
            with psycopg.connect(url, autocommit=True) as c:
                c.execute("DELETE FROM conveyor_jobs WHERE queue = %s", (QUEUE,))
            say(f"churn, tidying {tidy}: round {r + 1}: {rates[-1]:,} jobs/s")
        with psycopg.connect(url) as c:
            dead, vacuums, mib = c.execute(
                "SELECT n_dead_tup, vacuum_count, pg_total_relation_size(relid) / 1048576"
                " FROM pg_stat_user_tables"
                " WHERE relname = 'conveyor_jobs' AND schemaname = current_schema()"
            ).fetchone()
        app.close()
        emit(
            {
                "bench": "scale",
                "phase": "churn",
                "tidying": tidy,
                "jobs_per_round": n,
                "rates": rates,
                "first_3_mean": round(statistics.mean(rates[:3])),
                "last_3_mean": round(statistics.mean(rates[-3:])),
                "dead_rows_at_end": dead,
                "vacuums": vacuums,
                "jobs_table_mib_at_end": int(mib),
                "commit": commit(),
            },
            out,
        )


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def markdown(path: str) -> str:
    """The "Scale" section of bench/RESULTS.md, from a run's JSON lines."""
    import json

    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    out = [
        "## Scale",
        "",
        f"`bench/bench_scale.py` (`BENCH_SCALE=1 make bench`; raw results: `{path}`). "
        "Drains of no-op jobs by `conveyor worker --burst` processes, jobs/s from the first "
        "start to the last finish; every round in order.",
        "",
    ]
    workers = [r for r in rows if r["bench"] == "scale.workers"]
    if workers:
        out += [
            "More workers (goal 7), one queue, PostgreSQL:",
            "",
            "| table | processes | jobs/s per round | median | vs 1 process | top wait events "
            "(pg_stat_activity every 50 ms, active sessions) |",
            "|---|---|---|---|---|---|",
        ]
        for table in dict.fromkeys(r["table"] for r in workers):
            here = [r for r in workers if r["table"] == table]
            one = _median([r["rate"] for r in here if r["processes"] == 1])
            for k in sorted({r["processes"] for r in here}):
                mine = [r for r in here if r["processes"] == k]
                rates = [r["rate"] for r in mine]
                waits: Counter[str] = Counter()
                for r in mine:
                    waits.update(r.get("waits", {}))
                top = ", ".join(
                    f"{' '.join(w.split()).replace('|', '/')} {n}" for w, n in waits.most_common(3)
                )
                out.append(
                    f"| {table} | {k} | {' / '.join(f'{x:,}' for x in rates)} | "
                    f"{_median(rates):,.0f} | {_median(rates) / one:.2f}x | {top} |"
                )
        out.append("")
        empty = [r["rate"] for r in workers if r["table"] == "empty" and r["processes"] == 1]
        full = [r["rate"] for r in workers if r["table"] != "empty" and r["processes"] == 1]
        if empty and full:
            out += [
                f"One process with the waiting jobs vs an empty table (goal 6: at least 0.85x): "
                f"**{_median(full) / _median(empty):.2f}x**.",
                "",
            ]
    finished = [r for r in rows if r["bench"] == "scale.finished"]
    reads = [r for r in rows if r["bench"] == "scale.reads"]
    if finished:
        tables = list(dict.fromkeys(r["table"] for r in finished))
        rates = {t: [r["rate"] for r in finished if r["table"] == t] for t in tables}
        out += ["Finished jobs kept (goal 6), one process, PostgreSQL:", ""]
        for t in tables:
            out.append(f"- {t}: {' / '.join(f'{x:,}' for x in rates[t])} jobs/s")
        if len(tables) == 2:
            ratio = _median(rates[tables[1]]) / _median(rates[tables[0]])
            out.append(f"- ratio: **{ratio:.2f}x** (goal: at least 0.85x)")
        out.append("")
    if reads:
        tables = [r["table"] for r in reads]
        out += [
            "What status, the server and the dashboard read (goal 6: under 100 ms), "
            "p50 / max ms over 20 calls:",
            "",
            "| read | " + " | ".join(tables) + " |",
            "|---|" + "---|" * len(tables),
        ]
        names = [k for k in reads[0] if isinstance(reads[0][k], dict)]
        for name in names:
            cells = [f"{r[name]['p50_ms']} / {r[name]['max_ms']}" for r in reads]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("")
    for r in (r for r in rows if r["bench"] == "scale.memory"):
        out += [
            f"A worker's memory over {r['jobs']:,} jobs (goal 8: flat), {r['backend']}: RSS "
            f"{r['rss_mib_at_1pct']} MiB at 1%, {r['rss_mib_at_50pct']} at 50%, "
            f"{r['rss_mib_end']} at the end (max {r['rss_mib_max']}), {r['seconds']} s.",
            "",
        ]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--phases", default="workers,finished,memory")
    p.add_argument("--backends", default="postgres")
    p.add_argument("--n", type=int, default=40_000, help="jobs per drain")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--waiting", type=int, default=1_000_000)
    p.add_argument("--finished", type=int, default=10_000_000)
    p.add_argument("--memory-jobs", type=int, default=1_000_000)
    p.add_argument("--out")
    p.add_argument("--markdown", metavar="JSONL", help="print the Markdown section of a run")
    a = p.parse_args()
    if a.markdown:
        print(markdown(a.markdown))
        return
    phases = a.phases.split(",")
    for backend in a.backends.split(","):
        if "workers" in phases:
            phase_workers(backend, a.n, a.rounds, a.waiting, a.out)
        if "memory" in phases:
            phase_memory(backend, a.memory_jobs, a.out)
    if "finished" in phases:
        phase_finished(a.n, a.rounds, a.finished, a.out)
    if "churn" in phases:
        phase_churn(a.n, a.rounds, a.out)


if __name__ == "__main__":
    main()
