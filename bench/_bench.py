"""Helpers the Conveyor benchmark scripts share (run as scripts: bench/ is on sys.path)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parents[1]
PG_BASE = os.environ.get("PEERBENCH_PG", "postgresql://postgres@127.0.0.1:5432").rstrip("/")
SCRATCH = Path(os.environ.get("PEERBENCH_SCRATCH", "/tmp/peerbench"))


def commit() -> str:
    """The Conveyor commit measured (``-dirty`` with uncommitted changes), not
    counting bench/RESULTS.md, which `make bench` itself rewrites before its last
    steps run."""

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD") or "unknown"
        changed = git(
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":(exclude)bench/RESULTS.md",
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if changed else head


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (the shared harness's definition)."""
    v = sorted(values)
    k = max(0, min(len(v) - 1, round(p / 100.0 * len(v) + 0.5) - 1))
    return v[k]


def emit(row: dict, out: str | None) -> None:
    """Print a result as a JSON line, and append it to ``out``."""
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def db_url(backend: str, pg_db: str, sqlite_file: Path) -> str:
    return f"{PG_BASE}/{pg_db}" if backend == "postgres" else f"sqlite:///{sqlite_file}"


def fresh_database(backend: str, pg_db: str, sqlite_file: Path) -> None:
    """An empty database: dropped and created (PostgreSQL) or a new file (SQLite)."""
    if backend == "postgres":
        with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{pg_db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{pg_db}"')
    else:
        SCRATCH.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(str(sqlite_file) + suffix).unlink(missing_ok=True)
