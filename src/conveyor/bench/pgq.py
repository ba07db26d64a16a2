"""PgQueuer in the same run as ``conveyor bench --pgqueuer``, measured as the peer
harness measures it: every drain starts from new, empty PgQueuer tables (the
harness gives each run a new database), N no-op jobs enqueued in calls of 1,000,
then one PgQueuer worker process drains them (or, with ``--workers``, that many
started together); jobs/s from the first handler start
to the last handler end, and over the worker process's wall time.

Everything PgQueuer does runs in processes of its own (``pgq_worker.py``, by its
path) with ``PGQUEUER_PREFIX`` set to ``conveyor_bench_``: its tables, functions,
triggers and channel are the benchmark's own, made anew for each measurement and
dropped at the end, so a PgQueuer installation of the database's users is never
read or changed. Reusing one set of tables instead is not what the harness
measures: PgQueuer deletes each finished job, and until a VACUUM removes them its
dequeue walks the dead rows of every earlier drain (with autovacuum off, or
between its visits: a minute apart by default). So measured, on a server with
autovacuum off, its batch-100 drains went 7,898, 4,607, 4,769 jobs/s round after
round, and batch 10 ran at 518 jobs/s over 160,000 dead rows (about 2,000 from new
tables): Conveyor's ratios came out 15-50% higher than the harness's.

PgQueuer's bulk enqueue and batch-10 drain are measured once, after the drains."""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .cpu import children_cpu_s, per_job_us

PREFIX = "conveyor_bench_"
WORKER = Path(__file__).with_name("pgq_worker.py")


def _dsn(url: str) -> str:
    return "postgresql://" + url.split("://", 1)[1]


def _call(url: str, tmp: Path, command: str, *args: object) -> dict[str, Any]:
    """Runs one pgq_worker command in a process of its own; its JSON result."""
    return _calls(url, tmp, 1, command, *args)[0]


def _calls(
    url: str, tmp: Path, processes: int, command: str, *args: object
) -> list[dict[str, Any]]:
    """Runs one pgq_worker command in ``processes`` processes at once; their results."""
    outs = [tmp / f"pgq-{command}-{time.monotonic_ns()}-{i}.json" for i in range(processes)]
    env = {**os.environ, "PGQUEUER_PREFIX": PREFIX}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), command, _dsn(url), *map(str, args), str(o)], env=env
        )
        for o in outs
    ]
    codes = [p.wait() for p in procs]
    for code in codes:
        if code != 0:
            raise RuntimeError(f"PgQueuer's {command} process exited with status {code}")
    return [json.loads(o.read_text()) for o in outs]


def fresh(url: str, tmp: Path, n: int) -> float:
    """New empty tables of the benchmark's own, then N jobs enqueued: jobs/s."""
    _call(url, tmp, "fresh")
    return float(_call(url, tmp, "enqueue", n)["jobs_per_s"])


def one_by_one(url: str, tmp: Path, n: int) -> float:
    """New empty tables, then N jobs enqueued one per call: jobs/s."""
    _call(url, tmp, "fresh")
    return float(_call(url, tmp, "enqueue_one", n)["jobs_per_s"])


def drain(url: str, tmp: Path, n: int, batch: int, processes: int = 1) -> dict[str, Any]:
    """N jobs enqueued in new tables, then drained by ``processes`` PgQueuer worker
    processes started together: from the first handler start in any of them to the
    last end in any."""
    fresh(url, tmp, n)
    cpu = children_cpu_s()
    began = time.perf_counter()
    each = _calls(url, tmp, processes, "drain", batch)
    wall = time.perf_counter() - began
    cpu_us = per_job_us(cpu, children_cpu_s(), n)
    count = sum(int(e["count"]) for e in each)
    if count != n:
        raise RuntimeError(f"the PgQueuer workers ran {count} of {n} jobs")
    ran = [e for e in each if e["first"] is not None]
    span = max(max(float(e["last"]) for e in ran) - min(float(e["first"]) for e in ran), 1e-9)
    return {
        "jobs_per_s": round(n / span),
        "wall_jobs_per_s": round(n / wall),
        "cpu_us_per_job": cpu_us,
    }


def uninstall(url: str, tmp: Path) -> None:
    _call(url, tmp, "uninstall")


def check() -> Any:
    """The pgqueuer module, or a ConfigError saying what to install."""
    try:
        importlib.import_module("asyncpg")
        return importlib.import_module("pgqueuer")
    except ImportError as exc:
        raise ConfigError(
            f"--pgqueuer: {exc.name or 'PgQueuer'} is not installed"
            " (pip install 'conveyor[bench]', or pip install pgqueuer asyncpg)"
        ) from None


def run(
    url: str,
    n: int,
    tmp: Path,
    say: Callable[[str], None],
    rounds: int = 1,
    batch100: list[dict[str, Any]] | None = None,
    processes: int = 1,
) -> dict[str, Any]:
    """PgQueuer's bulk enqueue, its drain at batch 100 ``rounds`` times (the median
    and each run; or the runs given, measured beside Conveyor's drains) and at
    batch 10 once, each by ``processes`` worker processes."""
    workers = f"{processes} worker processes, " if processes > 1 else ""
    pgqueuer = check()
    result: dict[str, Any] = {"version": pgqueuer.__version__}
    try:
        say(f"pgqueuer: {n:,} jobs by Queries.enqueue, calls of 1,000")
        result["bulk_jobs_per_s"] = round(fresh(url, tmp, n))
        if batch100 is None:
            batch100 = []
            for r in range(rounds):
                say(
                    f"pgqueuer: drain of {n:,} no-op jobs, {workers}batch_size=100"
                    f" ({r + 1}/{rounds})"
                )
                batch100.append(drain(url, tmp, n, 100, processes))
        result["drain_batch100"] = round(statistics.median(d["jobs_per_s"] for d in batch100))
        result["drain_batch100_wall"] = round(
            statistics.median(d["wall_jobs_per_s"] for d in batch100)
        )
        result["drain_batch100_runs"] = [d["jobs_per_s"] for d in batch100]
        cpu = [d["cpu_us_per_job"] for d in batch100 if d.get("cpu_us_per_job") is not None]
        result["drain_batch100_cpu_us_per_job"] = round(statistics.median(cpu), 1) if cpu else None
        say(f"pgqueuer: drain of {n:,} no-op jobs, {workers}batch_size=10 (its default)")
        result["drain_batch10"] = drain(url, tmp, n, 10, processes)["jobs_per_s"]
    finally:
        uninstall(url, tmp)
    return result
