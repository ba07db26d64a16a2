"""Write a job's JSON columns straight into the database, past Conveyor's checks:
what an older version, a migration or a person with SQL may have left there."""

from __future__ import annotations

import sqlite3

import psycopg

from .conftest import _mysql_connect


def deep_json(depth: int, inner: str = "1") -> str:
    """``depth`` lists inside each other, as JSON text."""
    return "[" * depth + inner + "]" * depth


def poison(db_url: str, job_id: int, **columns: str) -> None:
    """Set ``columns`` (args, result, context, ...) of job ``job_id`` to these texts.
    MariaDB's JSON CHECK constraints are turned off for the session, so that any
    text goes in, as on SQLite."""
    names = sorted(columns)
    values = [columns[n] for n in names]
    if db_url.startswith("sqlite:"):
        sets = ", ".join(f"{n} = ?" for n in names)
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.execute(f"UPDATE conveyor_jobs SET {sets} WHERE id = ?", (*values, job_id))
        return
    sets = ", ".join(f"{n} = %s" for n in names)
    if db_url.startswith("postgresql:"):
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(f"UPDATE conveyor_jobs SET {sets} WHERE id = %s", (*values, job_id))
        return
    with _mysql_connect(db_url) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION check_constraint_checks = 0")
        cur.execute(f"UPDATE conveyor_jobs SET {sets} WHERE id = %s", (*values, job_id))
