"""Tidying: every claim and outcome leaves a dead row version behind. On
PostgreSQL, until VACUUM removes them, their entries in the fetch index lie in
front of the waiting jobs and every claim walks them; the leader's maintenance
vacuums a table whose dead rows piled up (autovacuum off, as on this machine's
server, or behind). SQLite and InnoDB have nothing to tidy."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from conveyor.runtime.maintenance import Maintenance

from ..conftest import only_on
from .helpers import ins


def _job_table_count(backend, column: str) -> int:
    """``vacuum_count`` or ``analyze_count`` of the live jobs' table (the partition
    of conveyor_jobs where claims and outcomes write, schema v17), as the server
    keeps it."""
    with backend._tx() as cur:
        cur.execute(
            f"SELECT coalesce(sum({column}), 0) AS n FROM pg_stat_user_tables s "
            "JOIN pg_class c ON c.oid = s.relid "
            "WHERE c.relname = 'conveyor_jobs_live' AND pg_table_is_visible(c.oid)"
        )
        return int(cur.fetchone()["n"])


def _vacuums(backend) -> int:
    return _job_table_count(backend, "vacuum_count")


def _analyzes(backend) -> int:
    return _job_table_count(backend, "analyze_count")


def test_the_leader_vacuums_a_job_table_full_of_dead_rows(app, backend, db_url):
    pg = db_url.startswith("postgresql")
    if pg:  # whatever the server's settings, autovacuum must not get there first
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE conveyor_jobs_live SET (autovacuum_enabled = false)")
    backend.job_insert_many(jobs=[ins(args=[i]) for i in range(600)])
    assert app.delete_jobs(queue="q").done == 600  # 600 dead rows
    kept = backend.job_insert_many(jobs=[ins(args=["kept"])])

    maintenance = Maintenance(backend, tidy_min_dead=500, tidy_every_s=0)
    if not pg:
        assert backend.tidy(min_dead=1) == []
        maintenance.step()
        assert backend.job_get(job_id=kept[0].id) is not None
        return
    before = _vacuums(backend)
    # The server's statistics reach the view within a second or so of the delete.
    deadline = time.monotonic() + 20
    while _vacuums(backend) == before and time.monotonic() < deadline:
        maintenance.step()  # starts a tidying pass on its own thread
        assert maintenance._tidying is not None
        maintenance._tidying.join(10)
        time.sleep(0.2)
    assert _vacuums(backend) > before, "conveyor_jobs_live was never vacuumed"
    assert backend.job_get(job_id=kept[0].id).state == "available"
    # Tidied: nothing is left over the threshold, so the next pass does nothing.
    assert "conveyor_jobs_live" not in backend.tidy(min_dead=500)
    maintenance.stop()


def test_the_leader_analyzes_a_job_table_loaded_since_its_last_statistics(app, backend, db_url):
    """A bulk load without statistics is planned as a near-empty table: the claim
    sorted every waiting job of its queue (bench_scale.py's memory phase, a million
    jobs, autovacuum off: 160 jobs/s). The leader's tidying ANALYZEs it."""
    if not db_url.startswith("postgresql"):
        assert backend.tidy(min_dead=1) == []
        return
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE conveyor_jobs_live SET (autovacuum_enabled = false)")
    backend.job_insert_stream(chunks=[[ins(args=[i]) for i in range(300)]] * 2)  # no dead rows
    maintenance = Maintenance(backend, tidy_min_dead=500, tidy_every_s=0)
    before = _analyzes(backend)
    deadline = time.monotonic() + 20
    while _analyzes(backend) == before and time.monotonic() < deadline:
        maintenance.step()
        assert maintenance._tidying is not None
        maintenance._tidying.join(10)
        time.sleep(0.2)
    assert _analyzes(backend) > before, "conveyor_jobs_live was never analyzed"
    assert "conveyor_jobs_live" not in backend.tidy(min_dead=500)  # fresh statistics now
    maintenance.stop()


def test_a_drained_job_table_is_vacuumed_not_only_analyzed(app, backend, db_url):
    """Analyzed while empty with its pages still on disk, the live partition is
    planned as holding 1 row however many it holds next (an outcome batch then
    compared each outcome with every other: half the drain rate). The leader's
    tidying vacuums a drained table it would analyze, which gives the pages back."""
    if not db_url.startswith("postgresql"):
        assert backend.tidy(min_dead=1) == []
        return
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE conveyor_jobs_live SET (autovacuum_enabled = false)")
    backend.job_insert_stream(chunks=[[ins(args=[i]) for i in range(300)]] * 2)
    assert app.delete_jobs(queue="q").done == 600  # drained: 600 rows changed, none left

    def live_dead_pages() -> tuple[int, int, int]:
        with backend._tx() as cur:
            cur.execute(
                "SELECT s.n_live_tup AS live, s.n_dead_tup AS dead, c.relpages AS pages "
                "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
                "WHERE c.relname = 'conveyor_jobs_live' AND pg_table_is_visible(c.oid)"
            )
            row = cur.fetchone()
            return int(row["live"]), int(row["dead"]), int(row["pages"])

    # the server's statistics reach the view within a second or so of the delete
    deadline = time.monotonic() + 20
    while live_dead_pages()[:2] != (0, 600) and time.monotonic() < deadline:
        time.sleep(0.2)
    before = _vacuums(backend)
    # 600 dead rows, under the threshold; 1,200 changed (inserted, deleted), over it
    assert "conveyor_jobs_live" in backend.tidy(min_dead=1000)
    assert _vacuums(backend) > before, "only analyzed: its pages stay, planned as 1 row"
    assert live_dead_pages()[2] == 0  # no pages left: planned from its size again


@only_on("postgres")  # the partition, ANALYZE and its statistics are PostgreSQL's
def test_a_table_analyzed_empty_with_its_pages_is_told_and_vacuumed(app, backend, db_url):
    """The state itself: ANALYZE of the drained partition (autovacuum's, or ours
    on statistics that lagged) records no rows while its pages stay. tidy()
    vacuums a table it analyzed into that state."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE conveyor_jobs_live SET (autovacuum_enabled = false)")
    backend.job_insert_stream(chunks=[[ins(args=[i]) for i in range(300)]] * 2)
    assert app.delete_jobs(queue="q").done == 600
    planned_empty = lambda: backend._rows("table_planned_empty", {"name": "conveyor_jobs_live"})  # noqa: E731
    assert not planned_empty()
    with backend.pool.connection() as conn:
        conn.execute("ANALYZE conveyor_jobs_live")
    assert planned_empty(), "analyzed empty with its pages: 1 row expected, whatever it holds"
    backend._maintain("VACUUM (SKIP_LOCKED)", "conveyor_jobs_live", 0, 0)
    assert not planned_empty()


@only_on("postgres")  # the only backend with something to tidy
def test_a_stopping_leader_does_not_wait_for_its_vacuum(backend):
    """The server finishes a VACUUM without its client, so a leader that stops
    (a `conveyor worker --burst` at its end) does not wait for one: it waited,
    up to 5 s, and a burst worker's exit took as long as the VACUUM."""
    entered, finish = threading.Event(), threading.Event()

    class SlowTidy:  # the real backend, with a VACUUM that takes until `finish`
        def __getattr__(self, name: str) -> Any:
            return getattr(backend, name)

        def tidy(self, *, min_dead: int = 50_000) -> list[str]:
            entered.set()
            finish.wait(30)
            return []

    maintenance = Maintenance(SlowTidy(), tidy_min_dead=1, tidy_every_s=0)
    maintenance.start()
    try:
        assert entered.wait(20), "the leader never tidied"
        timer = threading.Timer(3.0, finish.set)  # without the fix, stop() waits for this
        timer.start()
        maintenance.stop()
        assert not finish.is_set(), "stop() waited for the VACUUM to end"
    finally:
        finish.set()
