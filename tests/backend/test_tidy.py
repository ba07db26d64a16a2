"""Tidying: every claim and outcome leaves a dead row version behind. On
PostgreSQL, until VACUUM removes them, their entries in the fetch index lie in
front of the waiting jobs and every claim walks them; the leader's maintenance
vacuums a table whose dead rows piled up (autovacuum off, as on this machine's
server, or behind). SQLite and InnoDB have nothing to tidy."""

from __future__ import annotations

import time

import psycopg

from conveyor.runtime.maintenance import Maintenance

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
