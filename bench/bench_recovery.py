"""How soon a killed worker's job runs again elsewhere, with default settings.

Two `conveyor worker` processes (CLI defaults) on one database; a job that runs
for an hour starts on one of them; that process is killed with SIGKILL; the
figure is the time from the kill to the job starting again on the other. Three
rounds per backend.

    .venv/bin/python bench/bench_recovery.py [--backend sqlite|postgres] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parents[1]
PG = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")


def fresh_url(backend: str, scratch: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{scratch / 'recovery.db'}"
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS bench_recovery WITH (FORCE)")
        conn.execute("CREATE DATABASE bench_recovery")
    return f"{PG}/bench_recovery"


def starts(log: Path) -> list[tuple[float, int]]:
    if not log.exists():
        return []
    return [(float(t), int(p)) for t, p in (ln.split() for ln in log.read_text().splitlines())]


def wait(predicate, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise TimeoutError("waited too long")


def one_round(backend: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        url = fresh_url(backend, scratch)
        env = {**os.environ, "CONVEYOR_DATABASE_URL": url, "PYTHONPATH": str(REPO / "bench")}
        log = scratch / "starts.log"
        cmd = [sys.executable, "-m", "conveyor.cli.main", "worker", "--app", "recovery_app:app"]
        procs = [
            subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL, cwd=REPO / "bench")
            for _ in range(2)
        ]
        try:
            sys.path.insert(0, str(REPO / "bench"))
            import recovery_app

            recovery_app.app.url = url
            recovery_app.app.close()
            time.sleep(2)  # both workers up and heartbeating
            recovery_app.long.send(str(log))
            first = wait(lambda: starts(log))[0]
            victim = next(p for p in procs if p.pid == first[1])
            killed_at = time.time()
            victim.send_signal(signal.SIGKILL)
            again = wait(lambda: starts(log)[1:])[0]
            recovery_app.app.close()
            return again[0] - killed_at
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], action="append")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for backend in args.backend or ["sqlite", "postgres"]:
        figures = [one_round(backend) for _ in range(args.rounds)]
        shown = ", ".join(f"{f:.1f}" for f in figures)
        print(
            f"{backend}: killed worker's job running again after "
            f"{statistics.median(figures):.1f} s (median; runs {shown})"
        )


if __name__ == "__main__":
    main()
