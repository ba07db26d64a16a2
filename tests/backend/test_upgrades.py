"""Upgrades from schemas as they were released: a database created by an earlier
text of a migration (``old_schemas/``, copied from git history) is migrated by the
current code, ends with the schema a new database gets, and its waiting work runs.

MySQL's 0001 was edited in place three times after its release (9751346, 3edb14c
and 10d644b after 8fda283): a database of an earlier text lacked columns the
claims read, so every claim failed (Unknown column 'fetch_queue'). Some SQLite
indexes were edited the same way. Migration 0019 repairs both."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conveyor import Conveyor, JobState
from conveyor.backends import open_backend
from conveyor.backends.sql.loader import Migration

from ..conftest import _mysql_connect, mysql_database_url, pg_schema_url

ROOT = Path(__file__).resolve().parents[2]
OLD = Path(__file__).parent / "old_schemas"
#: the four texts of MySQL's 0001, oldest first (10d644b is today's)
MYSQL_0001 = ("8fda283", "9751346", "3edb14c", "10d644b")
#: SQLite files edited after their release: (file, commit of the first text)
SQLITE_EDITED = (
    ("0001_init", "282e4e2"),
    ("0006_placement", "cae1425"),
    ("0011_counts", "00570bf"),
    ("0011_counts", "fb9c677"),
    ("0017_no_waiting_index", "8b51d63"),
)


def _migration(path: Path) -> Migration:
    m = re.fullmatch(r"(\d{4})_(\w+?)(?:\.[0-9a-f]+)?\.sql", path.name)
    assert m, path
    return Migration(int(m.group(1)), m.group(2), path.read_text("utf-8"))


def released(current: list[Migration], dialect: str, variant: str) -> list[Migration]:
    """The migrations a database of ``variant`` ran: for MySQL the whole v13 with
    that text of 0001; else today's migrations before the edited file (they are
    the ones released then), and that file's first text."""
    if dialect == "mysql":
        first = _migration(OLD / "mysql" / f"0001_init.{variant}.sql")
        rest = [p for p in (OLD / "mysql").iterdir() if re.fullmatch(r"\d{4}_\w+\.sql", p.name)]
        return [first, *sorted((_migration(p) for p in rest), key=lambda m: m.version)]
    edited = _migration(OLD / dialect / f"{variant}.sql")
    return [m for m in current if m.version < edited.version] + [edited]


@contextmanager
def released_database(db_url: str, variant: str, monkeypatch) -> Iterator[Any]:
    """The test's database as ``variant`` made it; yields that backend (the
    current code, with only the old migrations, for the era's statements)."""
    first = open_backend(db_url)
    cls = type(first)
    first.close()
    monkeypatch.setattr(cls, "MIGRATIONS", released(cls.MIGRATIONS, _dialect(db_url), variant))
    old = open_backend(db_url)
    try:
        old.migrate()
        yield old
    finally:
        old.close()
        monkeypatch.undo()


# -- the schema -------------------------------------------------------------------------
def _rows(backend: Any, sql: str) -> list[dict[str, Any]]:
    with backend._tx() as cur:
        cur.execute(sql)
        names = [d[0] for d in cur.description]
        return [r if isinstance(r, dict) else dict(zip(names, r, strict=True)) for r in cur]


def schema(backend: Any, dialect: str) -> set[str]:
    """Every table, column, index, trigger and function, as text comparable
    between two databases (PostgreSQL's day partitions left out)."""
    if dialect == "sqlite":
        rows = _rows(backend, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
        return {" ".join(f"{r['type']} {r['name']} {r['sql']}".split()) for r in rows}
    if dialect == "mysql":
        out: set[str] = set()
        for t in _rows(backend, "SHOW TABLES"):
            [name] = t.values()
            [create] = _rows(backend, f"SHOW CREATE TABLE `{name}`")
            text = re.sub(r" AUTO_INCREMENT=\d+", "", create["Create Table"])
            out |= {f"{name}: {line.strip().rstrip(',')}" for line in text.splitlines()}
        return out
    day = r"_(before_)?[0-9]{8}"
    catalog = f"""
        SELECT 'rel ' || c.relname || ' ' || c.relkind::text AS x FROM pg_class c
        WHERE c.relnamespace = current_schema()::regnamespace AND c.relname !~ '{day}'
        UNION ALL
        SELECT 'col ' || table_name || '.' || column_name || ' ' || data_type || ' '
               || coalesce(column_default, '') || ' ' || is_nullable
        FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name !~ '{day}'
        UNION ALL
        SELECT 'idx ' || replace(indexdef, current_schema() || '.', '') FROM pg_indexes
        WHERE schemaname = current_schema() AND indexname !~ '{day}'
        UNION ALL
        SELECT 'fn ' || replace(pg_get_functiondef(p.oid), current_schema() || '.', '')
        FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
        UNION ALL
        SELECT 'trg ' || replace(pg_get_triggerdef(t.oid), current_schema() || '.', '')
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace
          AND c.relname !~ '{day}'
    """
    return {r["x"] for r in _rows(backend, catalog)}


def _dialect(db_url: str) -> str:
    return db_url.split(":", 1)[0].replace("postgresql", "postgres")


VARIANTS = [
    *(pytest.param("mysql", c, id=f"mysql-0001-{c}") for c in MYSQL_0001),
    pytest.param("postgres", "0001_init.282e4e2", id="postgres-0001-282e4e2"),
    *(pytest.param("sqlite", f"{f}.{c}", id=f"sqlite-{f[:4]}-{c}") for f, c in SQLITE_EDITED),
]


@pytest.mark.parametrize(("db_url", "variant"), VARIANTS, indirect=["db_url"])
def test_an_upgrade_from_a_released_text_ends_at_todays_schema(
    db_url, variant, monkeypatch, tmp_path
):
    dialect = _dialect(db_url)
    with released_database(db_url, variant, monkeypatch) as old:
        before = old.schema_version()
    app = Conveyor(db_url)
    try:
        assert app.migrate() == list(range(before + 1, app.backend.latest_schema + 1))
        upgraded = schema(app.backend, dialect)
    finally:
        app.close()
    with _sibling(db_url, tmp_path) as fresh_url:
        fresh = Conveyor(fresh_url)
        try:
            fresh.migrate()
            assert upgraded == schema(fresh.backend, dialect)
        finally:
            fresh.close()


@contextmanager
def _sibling(db_url: str, tmp_path: Path) -> Iterator[str]:
    """Another empty database beside the test's, of the same kind."""
    dialect, name = _dialect(db_url), f"fresh_{uuid.uuid4().hex[:10]}"
    if dialect == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
    elif dialect == "mysql":
        with _mysql_connect(db_url) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        try:
            yield mysql_database_url(db_url, name)
        finally:
            with _mysql_connect(db_url) as conn, conn.cursor() as cur:
                cur.execute(f"DROP DATABASE `{name}`")
    else:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        try:
            yield pg_schema_url(db_url, name)
        finally:
            with psycopg.connect(db_url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{name}" CASCADE')


# -- waiting work written by the old code runs after the upgrade --------------------------
ARGS = '{"args":[1,2],"kwargs":{}}'
#: a waiting job as the first release of each dialect wrote it
ERA_JOB = {
    "sqlite": "INSERT INTO conveyor_jobs (queue, task, args, state, max_attempts, created_at, "
    f"scheduled_at) VALUES ('default', 'add', '{ARGS}', 'available', 3, "
    "(julianday('now') - 2440587.5) * 86400.0, (julianday('now') - 2440587.5) * 86400.0)",
    "postgres": "INSERT INTO conveyor_jobs (queue, task, args, state, max_attempts, created_at, "
    f"scheduled_at) VALUES ('default', 'add', '{ARGS}', 'available', 3, now(), now())",
    # {changed}: 8fda283 stamped microseconds since the epoch, the later texts a
    # number taken from conveyor_change_tx
    "mysql": "INSERT INTO conveyor_jobs (queue, task, args, state, max_attempts, created_at, "
    f"scheduled_at, changed) VALUES ('default', 'add', '{ARGS}', 'available', 3, "
    "UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), {changed})",
}

FIRST_RELEASES = [
    *(pytest.param("mysql", c, id=f"mysql-0001-{c}") for c in MYSQL_0001),
    pytest.param("postgres", "0001_init.282e4e2", id="postgres-0001-282e4e2"),
    pytest.param("sqlite", "0001_init.282e4e2", id="sqlite-0001-282e4e2"),
]


def _insert_era_job(old: Any, dialect: str, variant: str) -> tuple[int, int | None]:
    """The job's id and (MySQL) its change stamp."""
    with old._tx() as cur:
        changed = None
        if dialect == "mysql":
            if variant == MYSQL_0001[0]:
                changed = int(time.time() * 1_000_000)
            else:
                cur.execute("INSERT INTO conveyor_change_tx () VALUES ()")
                changed = int(cur.lastrowid)
        cur.execute(ERA_JOB[dialect].replace("{changed}", str(changed)))
    [row] = _rows(old, "SELECT id FROM conveyor_jobs")
    return int(row["id"]), changed


def _stamp(backend: Any, job_id: int) -> int:
    [row] = _rows(backend, f"SELECT changed FROM conveyor_jobs WHERE id = {job_id}")
    return int(row["changed"])


def _burst_worker(db_url: str, tmp_path: Path) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    # this tree's code first (a worktree's too, not the installed package's)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        code = subprocess.call(
            [sys.executable, "-m", "conveyor.cli.main", "-d", db_url, "worker", "--app",
             "tests.cli.cliapp:app", "--burst", "--queues", "default"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=120,
        )  # fmt: skip
    return code, log.read_text()


@pytest.mark.parametrize(("db_url", "variant"), FIRST_RELEASES, indirect=["db_url"])
def test_a_job_waiting_in_a_first_release_database_runs_after_the_upgrade(
    db_url, variant, monkeypatch, tmp_path
):
    dialect = _dialect(db_url)
    with released_database(db_url, variant, monkeypatch) as old:
        job_id, stamp = _insert_era_job(old, dialect, variant)
    app = Conveyor(db_url)
    try:
        assert app.migrate()[-1] == app.backend.latest_schema
        code, log = _burst_worker(db_url, tmp_path)
        assert code == 0, log
        job = app.get_job(job_id)
        assert (job.state, job.result) == (JobState.SUCCEEDED, 3), log
        if stamp is not None:
            # new change numbers continue above the old stamps (8fda283's were
            # microseconds): a reader past the old stamp sees the job finish
            assert _stamp(app.backend, job_id) > stamp
    finally:
        app.close()


def test_the_repair_changes_nothing_on_todays_schema(app, db_url):
    """0019 on a database that has the real schema (every new one, and every one
    created since the last edit): run again, it leaves the same schema and jobs."""
    dialect = _dialect(db_url)
    app.migrate()
    job = app.enqueue("t", [1])
    before = schema(app.backend, dialect)
    [repair] = [m for m in app.backend.MIGRATIONS if m.version == 19]
    with app.backend._tx() as cur:
        app.backend._apply(cur, repair)
    assert schema(app.backend, dialect) == before
    assert app.get_job(job.id).state == JobState.AVAILABLE
