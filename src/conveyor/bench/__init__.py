"""``conveyor bench``: measure Conveyor on your own database, as you would run it.

Phases (each on the queue ``conveyor_bench`` only, whose jobs are deleted after
each phase; nothing else in the database is read or changed):

- ``enqueue``: ``enqueue_many`` of N jobs in calls of 1,000, the same N jobs in
  one call (median of 3), then one-by-one ``enqueue`` of N/10 (at most 2,000): jobs/s
  (with ``--pgqueuer``: ``rounds`` times, alternating with PgQueuer's one-by-one
  enqueue, and the median of the rounds' ratios).
- ``drain``: N no-op jobs waiting, then one ``conveyor worker --queues
  conveyor_bench --burst`` process with the CLI's defaults, as the README runs
  it (``--workers N``: N such processes started together, and PgQueuer's drains
  by N processes too; the span runs from the first start in any to the last end);
  jobs/s from the first handler start to the last handler end (as the shared
  peer harness measures every queue), and over the process's wall time (start-up
  and exit included); the median of ``rounds`` drains, each listed. Each drain
  starts from Conveyor's tables as autovacuum leaves them (PostgreSQL: the dead
  rows of the drains before vacuumed first), not from a new database as the peer
  harness's do: in this database, as it is run.
- ``latency``: one idle ``conveyor worker`` (defaults); 200 jobs sent at 50/s;
  the delay from each send to its handler's start, p50 / p99.
- ``limits``: ``rounds`` pairs of drains, one with a queue limit
  (``max_running``) of 1,000 that never binds (the worker runs 100 at most), one
  without, in alternating order; the median of the pairs' ratios (a machine's
  speed drifts between minutes more than a limit costs, so each limited drain is
  compared with the unlimited one beside it).

With ``pgqueuer`` importable and a PostgreSQL URL, ``--pgqueuer`` also runs
PgQueuer's bulk enqueue and its drain at batch 100 and at its default batch 10 in
the same run, each drain from new tables of the benchmark's own (``pgq.py``), and
gives the ratios. With the drain phase, PgQueuer's batch-100 drains alternate with
Conveyor's (round by round, the order swapped each round), and the drain ratio is
the median of the rounds' ratios, as the peer harness reports it: the machine's
speed drifts between minutes by more than the difference measured.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..app import Conveyor
from ..errors import ConfigError, redact_url
from .cpu import children_cpu_s, per_job_us

QUEUE = "conveyor_bench"
NOOP = "conveyor_bench.noop"
PING = "conveyor_bench.ping"
PHASES = ("enqueue", "drain", "latency", "limits")
CHUNK = 1_000


@dataclass
class Report:
    url: str
    jobs: int
    workers: int = 1
    results: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "jobs": self.jobs,
            "workers": self.workers,
            "results": self.results,
            "ratios": self.ratios,
        }


def _pct(values: list[float], p: float) -> float:
    v = sorted(values)
    k = max(0, min(len(v) - 1, round(p / 100.0 * len(v) + 0.5) - 1))
    return v[k]


class Bench:
    def __init__(
        self,
        url: str,
        jobs: int,
        say: Callable[[str], None],
        rounds: int,
        pgqueuer: bool = False,
        workers: int = 1,
    ) -> None:
        if jobs < 10:
            raise ConfigError(f"--jobs must be at least 10, got {jobs}")
        if rounds < 1:
            raise ConfigError(f"--rounds must be at least 1, got {rounds}")
        if workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {workers}")
        self.url, self.jobs, self.say, self.rounds = url, jobs, say, rounds
        self.pgqueuer = pgqueuer
        #: worker processes per drain (Conveyor's and PgQueuer's alike)
        self.workers = workers
        #: PgQueuer's batch-100 drains measured beside Conveyor's (phase_drain)
        self.pgq_batch100: list[dict[str, Any]] | None = None
        self.app = Conveyor(url)
        self.app.migrate()
        self.report = Report(redact_url(url), jobs, workers)
        self._tmp = Path(tempfile.mkdtemp(prefix="conveyor-bench-"))

    def close(self) -> None:
        try:
            self.clear()
            self.app.close()
        finally:  # the workers' logs and figures: read by now (a failure quotes its log)
            shutil.rmtree(self._tmp, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------
    def clear(self) -> None:
        self.app.delete_jobs(queue=QUEUE)

    def enqueue(self, n: int) -> None:
        for start in range(0, n, CHUNK):
            items = [(i,) for i in range(start, min(n, start + CHUNK))]
            self.app.enqueue_many(NOOP, items, queue=QUEUE)

    @contextmanager
    def worker(self, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
        out = self._tmp / f"worker-{time.monotonic_ns()}.json"
        env = {**os.environ, "CONVEYOR_DATABASE_URL": self.url, "CONVEYOR_BENCH_OUT": str(out)}
        cmd = [sys.executable, "-m", "conveyor.cli.main", "worker"]
        cmd += ["--app", "conveyor.bench.worker_app:app", "--queues", QUEUE, *extra]
        # the CLI's defaults, its log level too: what it logs goes to a file beside
        with open(out.with_suffix(".log"), "wb") as log:
            proc = subprocess.Popen(cmd, env=env, stderr=log)
        try:
            yield proc, out
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def drain(self) -> dict[str, Any]:
        # From tables as autovacuum leaves them (PostgreSQL; a no-op elsewhere), as
        # PgQueuer's drains start from new tables: the dead rows of the drains
        # before, which a server with autovacuum off keeps, slowed a drain by ~10%
        # (a new database: ~7% faster still). Only tables with the dead rows of
        # about a drain of the benchmark's own: none of a big table's few.
        self.app.backend.tidy(min_dead=max(1, self.jobs // 2), dead_fraction=0.0)
        self.enqueue(self.jobs)
        cpu = children_cpu_s()
        began = time.perf_counter()
        with ExitStack() as stack:
            # --workers: that many processes started together, each with the defaults
            started = [stack.enter_context(self.worker("--burst")) for _ in range(self.workers)]
            codes = [proc.wait() for proc, _out in started]
        wall = time.perf_counter() - began
        cpu_us = per_job_us(cpu, children_cpu_s(), self.jobs)
        for code, (_proc, out) in zip(codes, started, strict=True):
            if code != 0:
                said = out.with_suffix(".log").read_text(errors="replace")[-2_000:]
                raise RuntimeError(f"the benchmark worker exited with status {code}:\n{said}")
        each = [json.loads(out.read_text()) for _proc, out in started]
        count = sum(notes["count"] for notes in each)
        if count != self.jobs:
            raise RuntimeError(f"the workers ran {count} of {self.jobs} jobs")
        # from the first handler start in any process to the last end in any
        ran = [notes for notes in each if notes["first"] is not None]
        span = max(max(n["last"] for n in ran) - min(n["first"] for n in ran), 1e-9)
        self.clear()
        return {
            "jobs_per_s": round(self.jobs / span),
            "wall_jobs_per_s": round(self.jobs / wall),
            "cpu_us_per_job": cpu_us,
        }

    # -- phases ----------------------------------------------------------------------
    def phase_enqueue(self) -> None:
        self.say(f"enqueue: {self.jobs:,} jobs by enqueue_many, calls of {CHUNK:,}")
        t0 = time.perf_counter()
        self.enqueue(self.jobs)
        bulk = self.jobs / (time.perf_counter() - t0)
        self.clear()
        self.say(f"enqueue: {self.jobs:,} jobs by one enqueue_many call, median of 3")
        calls = []
        for _ in range(3):
            items = [(i,) for i in range(self.jobs)]
            t0 = time.perf_counter()
            self.app.enqueue_many(NOOP, items, queue=QUEUE)
            calls.append(self.jobs / (time.perf_counter() - t0))
            self.clear()
        self.report.results["enqueue"] = {
            "bulk_jobs_per_s": round(bulk),
            "one_call_jobs_per_s": round(sorted(calls)[1]),
            "one_call_runs": [round(c) for c in calls],
            **self._one_by_one(min(2_000, max(10, self.jobs // 10))),
        }

    def _one_by_one(self, one: int) -> dict[str, Any]:
        """One-by-one enqueue; with --pgqueuer, ``rounds`` times, alternating with
        PgQueuer's one-by-one enqueue (new tables each), the order swapped each
        round: their ratio is the median of the rounds'."""
        ours: list[float] = []
        theirs: list[float] = []
        for r in range(self.rounds if self.pgqueuer else 1):
            for mine in (True, False) if r % 2 == 0 else (False, True):
                if mine:
                    self.say(f"enqueue: {one:,} jobs one by one{self._round(r)}")
                    t0 = time.perf_counter()
                    for i in range(one):
                        self.app.enqueue(NOOP, [i], queue=QUEUE)
                    ours.append(one / (time.perf_counter() - t0))
                    self.clear()
                elif self.pgqueuer:
                    from . import pgq

                    self.say(f"pgqueuer: {one:,} jobs one by one{self._round(r)}")
                    theirs.append(pgq.one_by_one(self.url, self._tmp, one))
        out: dict[str, Any] = {"one_jobs_per_s": round(statistics.median(ours))}
        if theirs:
            out["one_runs"] = [round(x) for x in ours]
            out["pgqueuer_one_runs"] = [round(x) for x in theirs]
            out["one_round_ratios"] = [round(a / b, 2) for a, b in zip(ours, theirs, strict=True)]
        return out

    def _round(self, r: int) -> str:
        return f" ({r + 1}/{self.rounds})" if self.pgqueuer and self.rounds > 1 else ""

    def phase_drain(self) -> None:
        from . import pgq

        runs: list[dict[str, Any]] = []
        theirs: list[dict[str, Any]] = []
        for r in range(self.rounds):
            ours_first = r % 2 == 0 or not self.pgqueuer
            for mine in (True, False) if ours_first else (False, True):
                if mine:
                    self.say(
                        f"drain: {self.jobs:,} no-op jobs,"
                        f" {_processes(self.workers, '`conveyor worker --burst`')}"
                        f" (CLI defaults) ({r + 1}/{self.rounds})"
                    )
                    runs.append(self.drain())
                elif self.pgqueuer:
                    self.say(
                        f"drain: {self.jobs:,} no-op jobs,"
                        f" {_processes(self.workers, 'PgQueuer worker')},"
                        f" batch_size=100 ({r + 1}/{self.rounds})"
                    )
                    theirs.append(pgq.drain(self.url, self._tmp, self.jobs, 100, self.workers))
        self.report.results["drain"] = _medians(runs)
        if self.pgqueuer:
            self.pgq_batch100 = theirs
            for key, name in (("jobs_per_s", "round_ratios"), ("wall_jobs_per_s", "wall_ratios")):
                self.report.results["drain"][name] = [
                    round(a[key] / b[key], 2) for a, b in zip(runs, theirs, strict=True)
                ]

    def phase_limits(self) -> None:
        limited, unlimited, ratios = [], [], []
        for r in range(self.rounds):
            pair = {}
            for limit in (1_000, None) if r % 2 == 0 else (None, 1_000):
                what = "with a queue limit of 1,000 that never binds" if limit else "unlimited"
                self.say(f"limits: the drain {what} ({r + 1}/{self.rounds})")
                self.app.set_queue_limit(QUEUE, limit, force=True)
                try:
                    pair[limit] = self.drain()
                finally:
                    self.app.set_queue_limit(QUEUE, None, force=True)
            limited.append(pair[1_000])
            unlimited.append(pair[None])
            ratios.append(round(pair[1_000]["jobs_per_s"] / pair[None]["jobs_per_s"], 2))
        self.report.results["limits"] = {
            "queue_limit_1000": _medians(limited),
            "unlimited": _medians(unlimited),
            "round_ratios": ratios,
            "ratio_to_unlimited": round(statistics.median(ratios), 2),
        }

    def phase_latency(self, count: int = 200, rate: float = 50.0) -> None:
        self.say(f"latency: {count} jobs sent at {rate:g}/s to an idle `conveyor worker`")
        with self.worker() as (proc, out):
            time.sleep(2.0)  # the worker is up and idle
            for _ in range(count):
                self.app.enqueue(PING, [time.time()], queue=QUEUE)
                time.sleep(1 / rate)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                done = self.app.count_jobs(queue=QUEUE, state="succeeded").get("succeeded", 0)
                if done >= count:
                    break
                time.sleep(0.1)
            proc.terminate()
            proc.wait(30)
        delays = [d * 1000 for d in json.loads(out.read_text())["delays"]]
        self.clear()
        if not delays:
            raise RuntimeError("the latency worker ran no job")
        self.report.results["latency"] = {
            "jobs": len(delays),
            "p50_ms": round(_pct(delays, 50), 2),
            "p99_ms": round(_pct(delays, 99), 2),
        }

    def phase_pgqueuer(self) -> None:
        from . import pgq

        self.report.results["pgqueuer"] = pgq.run(
            self.url, self.jobs, self._tmp, self.say, self.rounds, self.pgq_batch100, self.workers
        )
        ours, theirs = self.report.results, self.report.results["pgqueuer"]
        if "drain" in ours:
            d = ours["drain"]
            # alternated round by round: the median of the rounds' ratios
            self.report.ratios["drain_vs_pgqueuer_batch100"] = round(
                statistics.median(d["round_ratios"]), 2
            )
            self.report.ratios["drain_with_start_up_vs_pgqueuer_batch100"] = round(
                statistics.median(d["wall_ratios"]), 2
            )
            self.report.ratios["drain_vs_pgqueuer_batch10"] = round(
                d["jobs_per_s"] / theirs["drain_batch10"], 2
            )
        if "enqueue" in ours:
            b = ours["enqueue"]["bulk_jobs_per_s"]
            self.report.ratios["bulk_enqueue_vs_pgqueuer"] = round(b / theirs["bulk_jobs_per_s"], 2)
            if "one_round_ratios" in ours["enqueue"]:
                self.report.ratios["one_by_one_enqueue_vs_pgqueuer"] = round(
                    statistics.median(ours["enqueue"]["one_round_ratios"]), 2
                )


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure of ``runs`` (drains), and the runs' jobs/s."""
    cpu = [r["cpu_us_per_job"] for r in runs if r.get("cpu_us_per_job") is not None]
    return {
        "jobs_per_s": round(statistics.median(r["jobs_per_s"] for r in runs)),
        "wall_jobs_per_s": round(statistics.median(r["wall_jobs_per_s"] for r in runs)),
        "runs": [r["jobs_per_s"] for r in runs],
        "cpu_us_per_job": round(statistics.median(cpu), 1) if cpu else None,
    }


def run(
    url: str,
    jobs: int = 20_000,
    phases: tuple[str, ...] = PHASES,
    pgqueuer: bool = False,
    say: Callable[[str], None] = lambda _m: None,
    rounds: int = 3,
    workers: int = 1,
) -> Report:
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise ConfigError(f"unknown phase(s) {', '.join(unknown)}; phases are: {', '.join(PHASES)}")
    if pgqueuer and not url.startswith(("postgres://", "postgresql://")):
        raise ConfigError("--pgqueuer needs a PostgreSQL URL (PgQueuer runs on PostgreSQL only)")
    if pgqueuer:
        from . import pgq

        pgq.check()  # before any phase: a missing package fails at once
    bench = Bench(url, jobs, say, rounds, pgqueuer, workers)
    try:
        bench.clear()
        for phase in PHASES:  # in this order whatever the order asked
            if phase in phases:
                getattr(bench, f"phase_{phase}")()
        if pgqueuer:
            bench.phase_pgqueuer()
    finally:
        bench.close()
    return bench.report


def _of(runs: list[Any]) -> str:
    return f", median of {len(runs)}" if len(runs) > 1 else ""


def _runs(runs: list[Any]) -> str:
    return f" (runs: {', '.join(f'{x:,}' for x in runs)})" if len(runs) > 1 else ""


def _enqueue_rows(report: Report) -> list[tuple[str, str]]:
    e = report.results["enqueue"]
    rows = [("bulk enqueue (enqueue_many, 1,000 per call)", f"{e['bulk_jobs_per_s']:,} jobs/s")]
    if "one_call_jobs_per_s" in e:
        rows.append(
            (
                f"bulk enqueue, {report.jobs:,} jobs in one enqueue_many call (median of 3)",
                f"{e['one_call_jobs_per_s']:,} jobs/s"
                f" (runs: {', '.join(f'{c:,}' for c in e['one_call_runs'])})",
            )
        )
    one = e.get("one_runs", [])
    rows.append(("one-by-one enqueue" + _of(one), f"{e['one_jobs_per_s']:,} jobs/s{_runs(one)}"))
    if "pgqueuer_one_runs" in e:
        theirs = e["pgqueuer_one_runs"]
        rows.append(
            (
                f"PgQueuer one-by-one enqueue, alternating with Conveyor's{_of(theirs)}",
                f"{round(statistics.median(theirs)):,} jobs/s{_runs(theirs)}",
            )
        )
    return rows


def _cpu(us: float | None) -> str:
    return "" if us is None else f"; the processes' CPU, start-up included: {us:g} µs per job"


def _processes(workers: int, what: str = "worker") -> str:
    return f"one {what} process" if workers == 1 else f"{workers} {what} processes"


def _drain_rows(d: dict[str, Any], workers: int) -> list[tuple[str, str]]:
    who = _processes(workers, "`conveyor worker --queues conveyor_bench --burst`")
    whose = "process's" if workers == 1 else "processes'"
    return [
        (
            f"drain, {who} (CLI defaults), first handler start to last end{_of(d['runs'])}",
            f"{d['jobs_per_s']:,} jobs/s ({d['wall_jobs_per_s']:,} over the"
            f" {whose} wall time, start-up included)"
            f"{_runs(d['runs'])}{_cpu(d.get('cpu_us_per_job'))}",
        )
    ]


def _limit_rows(lim: dict[str, Any]) -> list[tuple[str, str]]:
    rounds = lim["round_ratios"]
    return [
        (
            f"drain with a queue limit that never binds{_of(rounds)}",
            f"{lim['queue_limit_1000']['jobs_per_s']:,} jobs/s"
            f"{_runs(lim['queue_limit_1000']['runs'])}"
            f"; unlimited beside it {lim['unlimited']['jobs_per_s']:,}"
            f"{_runs(lim['unlimited']['runs'])}",
        ),
        (
            "limited / unlimited, median of the rounds' ratios",
            f"{lim['ratio_to_unlimited']:.2f}x"
            + (f" (rounds {', '.join(f'{x:.2f}' for x in rounds)})" if len(rounds) > 1 else ""),
        ),
    ]


def _pgqueuer_rows(r: dict[str, Any], workers: int) -> list[tuple[str, str]]:
    p = r["pgqueuer"]
    runs = p["drain_batch100_runs"]
    beside = ", alternating with Conveyor's" if "round_ratios" in r.get("drain", {}) else ""
    return [
        (f"PgQueuer {p['version']} bulk enqueue", f"{p['bulk_jobs_per_s']:,} jobs/s"),
        (
            f"PgQueuer drain, batch 100, {_processes(workers)}, new tables{beside}{_of(runs)}",
            f"{p['drain_batch100']:,} jobs/s ({p['drain_batch100_wall']:,} over its wall"
            f" time){_runs(runs)}{_cpu(p.get('drain_batch100_cpu_us_per_job'))}",
        ),
        (
            f"PgQueuer drain, batch 10 (its default), {_processes(workers)}",
            f"{p['drain_batch10']:,} jobs/s",
        ),
    ]


def _ratio_rows(report: Report) -> list[tuple[str, str]]:
    r = report.results
    rounds = {
        "drain_vs_pgqueuer_batch100": r.get("drain", {}).get("round_ratios", []),
        "drain_with_start_up_vs_pgqueuer_batch100": r.get("drain", {}).get("wall_ratios", []),
        "one_by_one_enqueue_vs_pgqueuer": r.get("enqueue", {}).get("one_round_ratios", []),
    }
    rows = []
    for name, ratio in report.ratios.items():
        each = rounds.get(name, [])
        rows.append(
            (
                name.replace("_", " ") + (", median of the rounds' ratios" if each else ""),
                f"**{ratio:.2f}x**"
                + (f" (rounds {', '.join(f'{x:.2f}' for x in each)})" if len(each) > 1 else ""),
            )
        )
    return rows


def markdown(report: Report) -> str:
    """The report as a Markdown table."""
    r = report.results
    rows: list[tuple[str, str]] = []
    if "enqueue" in r:
        rows += _enqueue_rows(report)
    if "drain" in r:
        rows += _drain_rows(r["drain"], report.workers)
    if "limits" in r:
        rows += _limit_rows(r["limits"])
    if "latency" in r:
        lat = r["latency"]
        rows.append(
            (
                "enqueue to handler start, idle worker",
                f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms",
            )
        )
    if "pgqueuer" in r:
        rows += _pgqueuer_rows(r, report.workers)
    rows += _ratio_rows(report)
    lines = [
        f"`conveyor bench` on {report.url}, {report.jobs:,} jobs"
        + (f", {report.workers} worker processes per drain" if report.workers > 1 else ""),
        "",
        "| measurement | result |",
        "|---|---|",
    ]
    lines += [f"| {a} | {b} |" for a, b in rows]
    return "\n".join(lines)
