"""Every user error is one red `error: ...` line on stderr and exit status 2."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from .conftest import TEST_APP, Invoke, conveyor_cmd, subprocess_env

COMMANDS = [
    [],
    ["worker"],
    ["migrate"],
    ["enqueue"],
    ["status"],
    ["demo"],
    ["jobs"],
    ["jobs", "list"],
    ["jobs", "show"],
    ["jobs", "retry"],
    ["jobs", "cancel"],
    ["batches"],
    ["batches", "list"],
    ["batches", "show"],
    ["batches", "cancel"],
    ["batches", "retry-failed"],
    ["queues"],
    ["queues", "list"],
    ["queues", "pause"],
    ["queues", "resume"],
    ["queues", "limit"],
    ["workers"],
    ["workers", "list"],
    ["workers", "stop"],
    ["prune"],
    ["periodic"],
    ["periodic", "list"],
]


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "root")
def test_every_command_has_help(invoke: Invoke, command: list[str]) -> None:
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    assert result.stdout.startswith("Usage: ")
    # Every subcommand is described in its parent's help.
    if command == ["jobs"]:
        assert all(name in result.stdout for name in ("list", "show", "retry", "cancel"))
    if command == ["batches"]:
        assert all(name in result.stdout for name in ("list", "show", "cancel", "retry-failed"))
    if command == ["queues"]:
        assert all(name in result.stdout for name in ("list", "pause", "resume", "limit"))
    if command == ["workers"]:
        assert all(name in result.stdout for name in ("list", "stop"))
    if not command:
        names = (
            "worker",
            "migrate",
            "enqueue",
            "status",
            "jobs",
            "batches",
            "queues",
            "workers",
            "prune",
            "periodic",
            "demo",
        )
        for name in (*names, "--database-url"):
            assert name in result.stdout


def test_module_entry_point_runs() -> None:
    proc = subprocess.run(
        conveyor_cmd("--version"),
        capture_output=True,
        text=True,
        timeout=30,
        env=subprocess_env(),
        check=False,
    )
    assert proc.returncode == 0
    assert "conveyor" in proc.stdout


def test_unsupported_url_names_the_supported_ones(invoke: Invoke) -> None:
    line = one_error_line(invoke("status", url="oracle://x"))
    assert "sqlite:///" in line and "postgresql://" in line and "mysql://" in line


def test_a_mysql_url_without_a_database_says_how_to_write_one(invoke: Invoke) -> None:
    line = one_error_line(invoke("status", url="mysql://x"))
    assert "names no database" in line and "mysql://user:pass@host:3306/dbname" in line


def test_unreachable_postgres_is_one_line(invoke: Invoke) -> None:
    line = one_error_line(invoke("status", url="postgresql://postgres@127.0.0.1:1/postgres"))
    assert "cannot connect to PostgreSQL" in line


def test_missing_sqlite_folder(invoke: Invoke, tmp_path: Path) -> None:
    line = one_error_line(invoke("status", url=f"sqlite:///{tmp_path}/nowhere/x.db"))
    assert "does not exist" in line


def test_schema_missing_says_to_migrate(invoke: Invoke, tmp_path: Path) -> None:
    line = one_error_line(invoke("jobs", "list", url=f"sqlite:///{tmp_path}/fresh.db"))
    assert "conveyor migrate" in line


def test_schema_too_new(invoke: Invoke, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.db"
    assert invoke("migrate", url=url).exit_code == 0
    # Pretend a newer Conveyor migrated this file (the test may use SQL; the CLI may not).
    with sqlite3.connect(tmp_path / "new.db") as conn:
        conn.execute("INSERT INTO conveyor_schema_version (version, name) VALUES (999, 'future')")
    conn.close()
    for args in (["migrate"], ["enqueue", "add", "--app", TEST_APP, "--args", "[1, 2]"]):
        line = one_error_line(invoke(*args, url=url))
        assert "schema version 999" in line and "upgrade the conveyor package" in line


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("nocolon", "module:attribute"),
        ("myapp.py", "module:attribute (e.g. myapp:app)"),
        ("myapp.py:app", "a module, not a file: myapp:app, not 'myapp.py:app'"),
        ("src/myapp.py:app", "a module, not a file: src.myapp:app"),
        ("no_such_module_xyz:app", "no module named 'no_such_module_xyz'"),
        ("tests.cli.cliapp:missing", "has no attribute 'missing'"),
        ("tests.cli.cliapp:register", "not a conveyor.Conveyor"),
        ("cli_broken_module:app", "importing 'cli_broken_module' failed with ZeroDivisionError"),
    ],
)
def test_bad_app(
    invoke: Invoke, spec: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A module in the current directory is importable, as with `python -m`.
    (tmp_path / "cli_broken_module.py").write_text("app = 1 / 0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # undo the CLI's sys.path change
    line = one_error_line(invoke("--app", spec, "worker"))
    assert expected in line


def test_worker_needs_an_app(invoke: Invoke) -> None:
    assert "--app" in one_error_line(invoke("worker"))


def test_bad_args_json(invoke: Invoke) -> None:
    line = one_error_line(invoke("enqueue", "add", "--app", TEST_APP, "--args", "[1,"))
    assert "--args is not valid JSON" in line


def test_args_must_be_an_array(invoke: Invoke) -> None:
    line = one_error_line(invoke("enqueue", "add", "--app", TEST_APP, "--args", '{"a": 1}'))
    assert "JSON array" in line


def test_kwargs_must_not_hold_job_options(invoke: Invoke) -> None:
    line = one_error_line(invoke("enqueue", "add", "--app", TEST_APP, "--kwargs", '{"delay": 1}'))
    assert "job options" in line


@pytest.mark.parametrize(
    "argv",
    [
        ["queues", "limit", "default", "-1"],
        ["jobs", "lst"],
        ["worker", "--concurrency", "many"],
        ["jobs", "list", "--state", "done"],
        ["nope"],
    ],
    ids=lambda a: " ".join(a),
)
def test_usage_errors_are_one_line_too(argv: list[str]) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli.main", "-d", "sqlite:///unused.db", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "--help" in lines[0]


def test_version_has_one_source() -> None:
    from importlib.metadata import version

    from click.testing import CliRunner

    import conveyor
    from conveyor.cli.main import cli

    out = CliRunner().invoke(cli, ["--version"]).output
    assert (
        out.strip()
        == f"conveyor, version {version('conveyor')}"
        == (f"conveyor, version {conveyor.__version__}")
    )


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--args", "[" * 40 + "]" * 40, "args[0] of task 'remote_t' nests lists and dicts more"),
        ("--kwargs", '{"k": ' + "[" * 40 + "]" * 40 + "}", "kwargs['k'] of task 'remote_t'"),
        ("--args", "[" * 100_000 + "]" * 100_000, "--args is nested too deeply to read"),
    ],
)
def test_a_payload_nested_too_deeply_is_one_error_line_and_stores_nothing(
    invoke: Invoke, tmp_path: Path, option: str, value: str, expected: str
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert invoke("migrate", url=url).exit_code == 0
    line = one_error_line(invoke("enqueue", "remote_t", option, value, url=url))
    assert expected in line, line
    listed = invoke("jobs", "list", "--json", url=url)
    assert listed.exit_code == 0 and listed.stdout.strip() == "[]", listed.output


def test_a_database_url_after_the_subcommand_is_the_global_one(
    invoke: Invoke, tmp_path: Path
) -> None:
    """`-d URL` where a user types it, after the subcommand (as `--app` may be):
    moved before it; not past `--`, not for `bench`, whose -d is its own."""
    from conveyor.cli.core import url_first

    db = tmp_path / "after.db"
    url = f"sqlite:///{db}"
    assert invoke("migrate", "-d", url).exit_code == 0 and db.exists()
    for args in (["status", "-d", url], ["jobs", "list", f"--database-url={url}"]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
    assert "no jobs" in invoke("jobs", "list", "--state", "failed", "-d", url).output
    names = ["status", "jobs", "bench"]
    assert url_first(["jobs", "list", "-d", "U", "--json"], names) == [
        "-d", "U", "jobs", "list", "--json",
    ]  # fmt: skip
    assert url_first(["bench", "-d", "U"], names) == ["bench", "-d", "U"]
    assert url_first(["status", "--", "-d", "U"], names) == ["status", "--", "-d", "U"]


def test_a_read_command_on_a_missing_sqlite_file_says_so_and_creates_none(
    invoke: Invoke, tmp_path: Path
) -> None:
    db = tmp_path / "conveyor.db"
    for command in (["status"], ["jobs", "list"], ["queues", "list"]):
        line = one_error_line(invoke(*command, url=f"sqlite:///{db}"))
        assert f"no database at {db}" in line and "-d URL" in line
    assert not db.exists()


def test_a_missing_database_or_login_says_what_the_server_answered(
    invoke: Invoke, mysql_base: str
) -> None:
    """Not 'check that the server is running' when it answered: no such database
    (Conveyor makes tables, not the database), or no such user."""
    import os

    from tests.conftest import PG_DEFAULT, PG_ENV, mysql_database_url

    info = psycopg.conninfo.conninfo_to_dict(os.environ.get(PG_ENV, PG_DEFAULT))
    host, port = info.get("host", "127.0.0.1"), info.get("port", 5432)
    pg = f"postgresql://{info.get('user', 'postgres')}@{host}:{port}/conveyor_no_such_db"
    for url in (pg, mysql_database_url(mysql_base, "conveyor_no_such_db")):
        line = one_error_line(invoke("status", url=url))
        assert "create that database" in line and "server is running" not in line, line
    line = one_error_line(invoke("status", url=f"postgresql://no_such_role@{host}:{port}/x"))
    assert "check the URL's user and password" in line and "postgresql://no_such_role@" in line
