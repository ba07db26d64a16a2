"""The CPU time of this process's finished child processes (user + system): a
drain's worker processes, waited for, cost their CPU per job. A loaded machine
moves this figure far less than it moves a rate. None where the platform has no
``resource`` module (Windows)."""

from __future__ import annotations


def children_cpu_s() -> float | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def per_job_us(before: float | None, after: float | None, jobs: int) -> float | None:
    if before is None or after is None:
        return None
    return round((after - before) / jobs * 1e6, 1)
