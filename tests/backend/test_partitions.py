"""PostgreSQL's partitioned job table (schema v17): unfinished jobs in the live
partition, finished ones in a day of their state; the migration keeps every job;
retention drops whole days; an outcome that moves a row under another statement
makes that statement run again, never fail or double-count."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from conveyor.records import JobFilter

from ..conftest import only_on
from .helpers import backend_at_schema, done, fetch, ins

#: the job table is partitioned on PostgreSQL only
pytestmark = only_on("postgres")


@pytest.fixture
def pg(backend):
    return backend


def _where(pg, job_id: int) -> str:
    with pg._tx() as cur:
        cur.execute(
            "SELECT tableoid::regclass::text AS t FROM conveyor_jobs WHERE id = %s", [job_id]
        )
        return str(cur.fetchone()["t"])


def _today() -> str:
    return datetime.now(UTC).strftime("%Y%m%d")


def _counts(pg) -> dict[str, int]:
    pg.counts_fold()
    out: dict[str, int] = {}
    for c in pg.queue_counts():
        out[c.state] = out.get(c.state, 0) + c.count
    return {k: v for k, v in out.items() if v}


def test_an_outcome_moves_its_job_out_of_the_live_partition(pg):
    ids = [r.id for r in pg.job_insert_many(jobs=[ins(args=[i]) for i in range(3)])]
    assert {_where(pg, i) for i in ids} == {"conveyor_jobs_live"}
    [a, b, c] = fetch(pg, n=3)
    pg.job_finalize_many(worker_id="w1", outcomes=[done(a), done(b, state="failed", error="boom")])
    assert _where(pg, a.id) == f"conveyor_jobs_succeeded_{_today()}"
    assert _where(pg, b.id) == f"conveyor_jobs_failed_{_today()}"
    assert _where(pg, c.id) == "conveyor_jobs_live"
    # A retry of the failed job brings it back to the live partition.
    assert pg.job_retry_many(filter=JobFilter(ids=(b.id,))) == [b.id]
    assert _where(pg, b.id) == "conveyor_jobs_live"
    assert _counts(pg) == {"available": 1, "running": 1, "succeeded": 1}


def test_the_migration_from_v16_keeps_every_job(db_url, monkeypatch):
    with backend_at_schema(db_url, monkeypatch, 16) as (old, upgrade):
        sent = old.job_insert_many(
            jobs=[ins(args=[i], idempotency_key=f"k{i}") for i in range(6)]
            + [ins(args=["later"], delay_s=3600), ins(args=["u"], unique_key="u1")]
        )
        jobs = fetch(old, n=4)
        old.job_finalize_many(
            worker_id="w1",
            outcomes=[done(jobs[0]), done(jobs[1], state="failed", error="x"), done(jobs[2])],
        )
        with old._tx() as cur:  # finished days ago: to the partition of the old ones
            cur.execute(
                "UPDATE conveyor_jobs SET finished_at = now() - interval '3 days' WHERE id = %s",
                [jobs[2].id],
            )
        before = {r.id: r for r in (old.job_get(job_id=s.id) for s in sent) if r}
        counts = _counts(old)
        assert upgrade() == list(range(17, old.latest_schema + 1))
        after = {s.id: old.job_get(job_id=s.id) for s in sent}
        assert after == before  # every job, every field, the same ids
        assert _counts(old) == counts
        assert _where(old, jobs[0].id) == f"conveyor_jobs_succeeded_{_today()}"
        assert _where(old, jobs[2].id) == f"conveyor_jobs_succeeded_before_{_today()}"
        assert _where(old, jobs[3].id) == "conveyor_jobs_live"
        # New ids continue the old sequence; the keys still hold, finished or not.
        [again] = old.job_insert_many(jobs=[ins(args=["again"], idempotency_key="k0")])
        assert again.created is False
        [new] = old.job_insert_many(jobs=[ins(args=["new"])])
        assert new.id > max(s.id for s in sent)
        [dup] = old.job_insert_many(jobs=[ins(args=["u"], unique_key="u1")])
        assert dup.created is False
        # v18's column defaults: a bulk COPY of jobs that start now
        streamed = old.job_insert_stream(chunks=[[ins(args=[i]) for i in range(3)]])
        got = [old.job_get(job_id=r.id) for r in streamed]
        assert [j.args for j in got] == [[0], [1], [2]]
        assert all(j.state == "available" and j.scheduled_at == j.created_at for j in got)


def test_an_idempotency_key_held_by_a_finished_job_is_refused(pg):
    [first] = pg.job_insert_many(jobs=[ins(args=[1], idempotency_key="order-7")])
    [job] = fetch(pg)
    pg.job_finalize_many(worker_id="w1", outcomes=[done(job)])
    assert _where(pg, first.id).startswith("conveyor_jobs_succeeded_")
    [again] = pg.job_insert_many(jobs=[ins(args=[2], idempotency_key="order-7")])
    assert (again.id, again.created) == (first.id, False)
    assert _counts(pg) == {"succeeded": 1}


def _move_in_open_transaction(pg, job_id: int) -> psycopg.Connection:
    """Another session finishes the job and holds its transaction open."""
    conn = psycopg.connect(pg.url)
    conn.execute(
        "UPDATE conveyor_jobs SET state = 'succeeded', finished_at = now(), lease_token = NULL "
        "WHERE id = %s",
        [job_id],
    )
    return conn


def _in_thread(fn):
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # reported to the test
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_a_send_racing_the_finish_of_its_key_holder_finds_it(pg):
    """The duplicate waits on the job its key names; once that job has moved to
    a finished partition the statement is rolled back and run again, and finds it
    there (without the lock it would have inserted a second job with the key)."""
    [first] = pg.job_insert_many(jobs=[ins(args=[1], idempotency_key="pay-1")])
    [job] = fetch(pg)
    conn = _move_in_open_transaction(pg, job.id)
    try:
        t, out = _in_thread(
            lambda: pg.job_insert_many(jobs=[ins(args=[2], idempotency_key="pay-1")])
        )
        time.sleep(0.5)
        assert t.is_alive(), out  # waiting on the row lock
        conn.commit()
        t.join(10)
    finally:
        conn.close()
    assert "error" not in out, out
    [again] = out["value"]  # type: ignore[misc]
    assert (again.id, again.created) == (first.id, False)
    assert pg.job_count(filter=JobFilter()) == {"succeeded": 1}


def test_an_outcome_racing_a_move_is_run_again_and_refused(pg):
    """A late outcome waiting on a job that another session finishes: the server
    aborts it (the row moved partitions); run again, it finds no running job
    under its token and is refused, as any late outcome."""
    pg.job_insert_many(jobs=[ins(args=[1])])
    [job] = fetch(pg)
    conn = _move_in_open_transaction(pg, job.id)
    try:
        t, out = _in_thread(lambda: pg.job_finalize_many(worker_id="w1", outcomes=[done(job)]))
        time.sleep(0.5)
        assert t.is_alive(), out
        conn.commit()
        t.join(10)
    finally:
        conn.close()
    assert out == {"value": []}
    assert _counts(pg) == {"succeeded": 1}


def _days(pg, state: str) -> list[str]:
    with pg._tx() as cur:
        cur.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(%s) ORDER BY 1",
            [f"conveyor_jobs_{state}"],
        )
        return [str(r["relname"]) for r in cur.fetchall()]


def test_retention_drops_whole_days(pg):
    pg.job_insert_many(jobs=[ins(args=[i]) for i in range(5)])
    jobs = fetch(pg, n=5)
    pg.job_finalize_many(
        worker_id="w1",
        outcomes=[done(j) for j in jobs[:4]] + [done(jobs[4], state="failed", error="x")],
    )
    with pg._tx() as cur:  # one of them finished before the days were made
        cur.execute(
            "UPDATE conveyor_jobs SET finished_at = now() - interval '9 days' WHERE id = %s",
            [jobs[0].id],
        )
    today = f"conveyor_jobs_succeeded_{_today()}"
    assert today in _days(pg, "succeeded")
    # A week on, today's day is past the retention: dropped whole, counts kept
    # right; so is the partition of the jobs from before the upgrade (one of them
    # now); failures are kept.
    week = datetime.now(UTC) + timedelta(days=8, hours=1)
    n = pg.job_prune(state="succeeded", older_than_s=7 * 86400.0, now=week)
    assert n == 4
    assert today not in _days(pg, "succeeded")
    assert "conveyor_jobs_succeeded_rest" in _days(pg, "succeeded")
    assert [pg.job_get(job_id=j.id) for j in jobs[:4]] == [None] * 4
    assert pg.job_get(job_id=jobs[4].id) is not None
    assert _counts(pg) == {"failed": 1}
    assert pg.job_attempts(job_id=jobs[4].id)  # the failure's attempt is kept
    # New days are made again at the next pass, from today on.
    pg._days_made_at = float("-inf")
    pg.job_prune(state="succeeded", older_than_s=7 * 86400.0)
    assert today in _days(pg, "succeeded")


def test_a_day_holding_a_job_of_an_open_batch_is_kept(pg):
    """As row by row retention keeps the jobs of an open batch, a day that holds
    one is not dropped; its other jobs go row by row."""
    batch_id, _ = pg.batch_create(
        name=None,
        task="t",
        idempotency_key=None,
        on_complete_json=None,
        jobs=[ins(args=[i]) for i in range(2)],
    )
    pg.job_insert_many(jobs=[ins(args=["alone"])])
    jobs = fetch(pg, n=3)
    pg.job_finalize_many(worker_id="w1", outcomes=[done(j) for j in jobs[:2]] + [done(jobs[2])])
    week = datetime.now(UTC) + timedelta(days=8, hours=1)
    pg.job_prune(state="succeeded", older_than_s=7 * 86400.0, now=week)
    assert f"conveyor_jobs_succeeded_{_today()}" in _days(pg, "succeeded")
    kept = [j for j in jobs if pg.job_get(job_id=j.id) is not None]
    assert len(kept) == 2 and all(pg.job_get(job_id=j.id).batch_id == batch_id for j in kept)
    assert pg.batch_progress(batch_id=batch_id) == {"succeeded": 2}


def test_an_idempotency_key_taken_and_finished_while_an_insert_ran_is_not_taken_twice(pg):
    """The insert's snapshot predates the other job; that job finished (left the
    live partition, whose unique index alone the insert meets) before the insert
    reached the index. A trigger of the test's holds the first insert between the
    two, so the race is run, not hoped for (CI once made two jobs of a cron tick)."""
    from conveyor.backends.postgres.backend import PostgresBackend

    with psycopg.connect(pg.url, autocommit=True) as c:
        c.execute("CREATE SEQUENCE race_gate")  # not transactional: nothing waits on it
        c.execute(
            "CREATE FUNCTION race_hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.idempotency_key = 'race' AND nextval('race_gate') = 1 THEN "
            "PERFORM pg_sleep(1.5); END IF; RETURN NEW; END $$"
        )
        c.execute(
            "CREATE TRIGGER race_hold BEFORE INSERT ON conveyor_jobs_live "
            "FOR EACH ROW EXECUTE FUNCTION race_hold()"
        )
    held: dict = {}
    first = threading.Thread(
        target=lambda: held.update(r=pg.job_insert_many(jobs=[ins(idempotency_key="race")]))
    )
    first.start()
    time.sleep(0.5)  # the first insert is in the trigger's sleep, its snapshot taken
    other = PostgresBackend(pg.url)
    try:
        [won] = other.job_insert_many(jobs=[ins(idempotency_key="race")])
        assert won.created
        [job] = fetch(other, 1)
        assert other.job_finalize_many(worker_id="w1", outcomes=[done(job)]) == [job.id]
    finally:
        other.close()
    first.join(10)
    [res] = held["r"]
    assert (res.id, res.created) == (won.id, False)
    keyed = pg.job_list(filter=JobFilter(), limit=10)
    assert [j.id for j in keyed if j.idempotency_key == "race"] == [won.id]
