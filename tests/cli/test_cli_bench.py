"""``conveyor bench`` runs its phases on the database it is given, through a real
``conveyor worker`` process, and touches nothing but its own queue. Its figures
are not checked here (benchmarks are benchmarks): only that they are there."""

from __future__ import annotations

import json
import tempfile

import psycopg
import pytest

from conveyor import Conveyor

from ..conftest import only_on
from .conftest import Invoke


def test_bench_measures_and_leaves_other_jobs_alone(
    invoke: Invoke, db_url: str, tmp_path, monkeypatch
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where its workers' files go
    app = Conveyor(db_url)
    mine = app.enqueue("someone_elses_task", [1], queue="default")
    app.close()

    result = invoke(
        "bench",
        "--jobs",
        "200",
        "--rounds",
        "1",
        "--phases",
        "enqueue,drain,limits",
        "--json",
        url=db_url,
    )

    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["jobs"] == 200
    r = report["results"]
    assert r["enqueue"]["bulk_jobs_per_s"] > 0 and r["enqueue"]["one_jobs_per_s"] > 0
    assert r["drain"]["jobs_per_s"] > 0  # the worker ran all 200 (bench checks the count)
    assert r["limits"]["queue_limit_1000"]["jobs_per_s"] > 0
    # each limited drain is compared with the unlimited one beside it
    assert len(r["limits"]["unlimited"]["runs"]) == len(r["limits"]["round_ratios"]) == 1
    app = Conveyor(db_url)
    try:
        assert app.get_job(mine.id).state == "available"
        assert app.count_jobs(queue="conveyor_bench").get("available", 0) == 0
        assert not [q for q in app.queues() if q.name == "conveyor_bench" and q.max_running]
    finally:
        app.close()
    assert not list(scratch.iterdir())  # its workers' logs and figures went with it


def test_bench_drains_with_several_worker_processes(invoke: Invoke, db_url: str) -> None:
    result = invoke(
        "bench", "--jobs", "300", "--rounds", "1", "--phases", "drain", "--workers", "2",
        "--json", url=db_url,
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["workers"] == 2
    assert report["results"]["drain"]["jobs_per_s"] > 0  # the two ran all 300 between them
    assert report["results"]["drain"]["cpu_us_per_job"] > 0  # the two processes' CPU
    app = Conveyor(db_url)
    try:
        assert app.count_jobs(queue="conveyor_bench") == {}
    finally:
        app.close()


def test_bench_refuses_an_unknown_phase(invoke: Invoke, tmp_path) -> None:
    result = invoke("bench", "--phases", "drain,warp", url=f"sqlite:///{tmp_path / 'b.db'}")
    assert result.exit_code == 2
    assert "unknown phase(s) warp" in result.output


def test_bench_refuses_zero_rounds(invoke: Invoke, tmp_path) -> None:
    result = invoke("bench", "--rounds", "0", url=f"sqlite:///{tmp_path / 'b.db'}")
    assert result.exit_code == 2
    assert "--rounds" in result.output


def test_bench_with_pgqueuer_needs_postgresql(invoke: Invoke, tmp_path) -> None:
    result = invoke("bench", "--pgqueuer", url=f"sqlite:///{tmp_path / 'b.db'}")
    assert result.exit_code == 2
    assert "--pgqueuer needs a PostgreSQL URL" in result.output


@only_on("postgres")
def test_bench_with_pgqueuer_uses_tables_of_its_own(invoke: Invoke, db_url: str) -> None:
    """PgQueuer's drains and one-by-one enqueues alternate with Conveyor's, each
    from new tables of the benchmark's own (prefixed), dropped at the end: a
    PgQueuer table of the database's users is neither read nor changed."""
    pytest.importorskip("pgqueuer")
    pytest.importorskip("asyncpg")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE pgqueuer (mine int)")
        conn.execute("INSERT INTO pgqueuer VALUES (42)")

    result = invoke(
        "bench",
        "--jobs",
        "100",
        "--rounds",
        "2",
        "--phases",
        "enqueue,drain",
        "--workers",
        "2",
        "--pgqueuer",
        "--json",
        url=db_url,
    )

    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    r = report["results"]
    assert len(r["drain"]["runs"]) == len(r["pgqueuer"]["drain_batch100_runs"]) == 2
    assert len(r["enqueue"]["one_runs"]) == len(r["enqueue"]["pgqueuer_one_runs"]) == 2
    assert len(r["enqueue"]["one_round_ratios"]) == 2
    assert report["ratios"]["one_by_one_enqueue_vs_pgqueuer"] > 0
    assert len(r["drain"]["round_ratios"]) == len(r["drain"]["wall_ratios"]) == 2
    assert report["workers"] == 2  # PgQueuer's drains by two processes as well
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT mine FROM pgqueuer").fetchall() == [(42,)]
        left = conn.execute(
            "SELECT relname FROM pg_class WHERE relname LIKE 'conveyor\\_bench\\_%'"
        ).fetchall()
        assert left == []
