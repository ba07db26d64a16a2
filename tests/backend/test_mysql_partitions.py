"""MariaDB's partitioned job table (schema v22): unfinished jobs in the partition
`live`, finished ones in a day of their state; the migration keeps every job and
the waiting ones then run; idempotency keys hold across partitions (the keys
table); retention drops whole days, their counts, attempts and keys with them."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pymysql

from conveyor.records import JobFilter

from ..conftest import only_on
from .helpers import backend_at_schema, done, fetch, ins

#: the dialect's own partitioning
pytestmark = only_on("mysql")


def _partitions(my) -> list[str]:
    with my._tx() as cur:
        cur.execute(
            "SELECT PARTITION_NAME AS p FROM information_schema.PARTITIONS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'conveyor_jobs' "
            "ORDER BY PARTITION_ORDINAL_POSITION"
        )
        return [str(r["p"]) for r in cur.fetchall()]


def _where(my, job_id: int) -> str | None:
    """The partition that holds the job (read partition by partition)."""
    with my._tx() as cur:
        for p in _partitions(my):
            cur.execute(f"SELECT 1 FROM conveyor_jobs PARTITION ({p}) WHERE id = %s", [job_id])
            if cur.fetchall():
                return p
    return None


def _today() -> str:
    return datetime.now(UTC).strftime("%Y%m%d")


def _a_week_on() -> datetime:
    """A week and a day after today's midnight (UTC): only today is wholly past a
    7-day retention then, whatever the hour (an hour after now, late in the UTC
    day, tomorrow was past it too)."""
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight + timedelta(days=8, minutes=1)


def _tomorrow() -> str:
    return (datetime.now(UTC) + timedelta(days=1)).strftime("%Y%m%d")


def _counts(my) -> dict[str, int]:
    my.counts_fold()
    out: dict[str, int] = {}
    for c in my.queue_counts():
        out[c.state] = out.get(c.state, 0) + c.count
    return {k: v for k, v in out.items() if v}


def _keys(my) -> dict[str, int]:
    with my._tx() as cur:
        cur.execute("SELECT idempotency_key AS k, job_id FROM conveyor_job_keys")
        return {str(r["k"]): int(r["job_id"]) for r in cur.fetchall()}


def test_an_outcome_moves_its_job_out_of_the_live_partition(backend):
    ids = [r.id for r in backend.job_insert_many(jobs=[ins(args=[i]) for i in range(3)])]
    assert {_where(backend, i) for i in ids} == {"live"}
    [a, b, c] = fetch(backend, n=3)
    outcomes = [done(a), done(b, state="failed", error="boom")]
    backend.job_finalize_many(worker_id="w1", outcomes=outcomes)
    assert _where(backend, a.id) == f"succeeded_{_today()}"
    assert _where(backend, b.id) == f"failed_{_today()}"
    assert _where(backend, c.id) == "live"
    # A retry of the failed job brings it back to the live partition.
    assert backend.job_retry_many(filter=JobFilter(ids=(b.id,))) == [b.id]
    assert _where(backend, b.id) == "live"
    assert _counts(backend) == {"available": 1, "running": 1, "succeeded": 1}


def test_the_migration_from_v20_keeps_every_job_and_the_waiting_ones_run(db_url, monkeypatch):
    with backend_at_schema(db_url, monkeypatch, 20) as (old, upgrade):
        sent = old.job_insert_many(
            jobs=[ins(args=[i], idempotency_key=f"k{i}") for i in range(6)]
            + [ins(args=["later"], delay_s=3600), ins(args=["u"], unique_key="u1")]
        )
        # Finished under v20 (this code's claims need v22's column): by hand, as
        # a worker of then left them; the third days ago.
        ids = [s.id for s in sent[:3]]
        with old._tx() as cur:
            cur.execute(
                "UPDATE conveyor_jobs SET state = IF(id = %s, 'failed', 'succeeded'), "
                "attempt = 1, started_at = UTC_TIMESTAMP(6), "
                "finished_at = UTC_TIMESTAMP(6) - INTERVAL IF(id = %s, 3, 0) DAY "
                "WHERE id IN (%s, %s, %s)",
                [ids[1], ids[2], *ids],
            )
        jobs = [old.job_get(job_id=i) for i in ids]
        before = {r.id: r for r in (old.job_get(job_id=s.id) for s in sent) if r}
        counts = _counts(old)
        assert upgrade() == list(range(21, old.latest_schema + 1))
        after = {s.id: old.job_get(job_id=s.id) for s in sent}
        assert after == before  # every job, every field, the same ids
        assert _counts(old) == counts
        assert _where(old, jobs[0].id) == f"succeeded_{_today()}"
        assert _where(old, jobs[1].id) == f"failed_{_today()}"
        assert _where(old, jobs[2].id) == f"succeeded_before_{_today()}"
        assert _keys(old) == {f"k{i}": sent[i].id for i in range(6)}
        # The keys still hold, finished or not; new ids continue the old ones.
        [again] = old.job_insert_many(jobs=[ins(args=["again"], idempotency_key="k0")])
        assert (again.id, again.created) == (sent[0].id, False)
        [dup] = old.job_insert_many(jobs=[ins(args=["u"], unique_key="u1")])
        assert (dup.id, dup.created) == (sent[7].id, False)
        [new] = old.job_insert_many(jobs=[ins(args=["new"])])
        assert new.id > max(s.id for s in sent)
        # The jobs that waited run now, and leave the live partition.
        waiting = fetch(old, n=10)
        assert sorted(j.id for j in waiting) == sorted([s.id for s in sent[3:6]] + [dup.id, new.id])
        assert old.job_finalize_many(worker_id="w1", outcomes=[done(j) for j in waiting])
        assert {_where(old, j.id) for j in waiting} == {f"succeeded_{_today()}"}
        assert _counts(old) == {"succeeded": 7, "failed": 1, "scheduled": 1}


def test_an_idempotency_key_held_by_a_finished_job_is_refused(backend):
    [first] = backend.job_insert_many(jobs=[ins(args=[1], idempotency_key="order-7")])
    [job] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job)])
    assert _where(backend, first.id) == f"succeeded_{_today()}"
    [again] = backend.job_insert_many(
        jobs=[ins(args=[2], idempotency_key="order-7"), ins(args=[3], idempotency_key="x")]
    )[:1]
    assert (again.id, again.created) == (first.id, False)
    assert _counts(backend) == {"succeeded": 1, "available": 1}
    # Deleting the job frees its key (the keys table follows the rows).
    backend.job_delete_many(filter=JobFilter(ids=(first.id,)))
    [third] = backend.job_insert_many(jobs=[ins(args=[4], idempotency_key="order-7")])
    assert third.created and _keys(backend)["order-7"] == third.id


def test_a_send_racing_the_finish_of_its_key_holder_finds_it(backend):
    """The duplicate's trigger waits on the job its key names (a locking read);
    once that job has moved to a finished partition it reads it there, and the
    insert is skipped (without the lock it would insert a second job with the
    key, in the live partition that the holder has just left)."""
    [first] = backend.job_insert_many(jobs=[ins(args=[1], idempotency_key="pay-1")])
    [job] = fetch(backend)
    kw = backend._kwargs
    conn = pymysql.connect(**kw, autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "UPDATE conveyor_jobs SET state = 'succeeded', finished_at = UTC_TIMESTAMP(6), "
                "lease_token = NULL WHERE id = %s",
                [job.id],
            )
        out: dict[str, object] = {}

        def send() -> None:
            try:
                out["value"] = backend.job_insert_many(
                    jobs=[ins(args=[2], idempotency_key="pay-1")]
                )
            except BaseException as exc:  # reported to the test
                out["error"] = exc

        t = threading.Thread(target=send)
        t.start()
        time.sleep(0.5)
        assert t.is_alive(), out  # waiting on the row lock
        conn.commit()
        t.join(10)
    finally:
        conn.close()
    assert "error" not in out, out
    [again] = out["value"]  # type: ignore[misc]
    assert (again.id, again.created) == (first.id, False)
    assert backend.job_count(filter=JobFilter()) == {"succeeded": 1}


def test_retention_drops_whole_days(backend):
    backend.job_insert_many(
        jobs=[ins(args=[i], idempotency_key=f"r{i}") for i in range(5)] + [ins(args=["w"])]
    )
    jobs = fetch(backend, n=5)
    backend.job_finalize_many(
        worker_id="w1",
        outcomes=[done(j) for j in jobs[:4]] + [done(jobs[4], state="failed", error="x")],
    )
    today = f"succeeded_{_today()}"
    assert today in _partitions(backend)
    # A week on, today's day is past the retention: dropped whole, with its
    # attempts and keys, counts kept right; failures are kept.
    week = _a_week_on()
    assert backend.job_prune(state="succeeded", older_than_s=7 * 86400.0, now=week) == 4
    assert today not in _partitions(backend)
    assert "succeeded_rest" in _partitions(backend)
    assert [backend.job_get(job_id=j.id) for j in jobs[:4]] == [None] * 4
    assert backend.job_get(job_id=jobs[4].id) is not None
    assert _counts(backend) == {"failed": 1, "available": 1}
    assert backend.job_attempts(job_id=jobs[4].id)  # the failure's attempt is kept
    with backend._tx() as cur:
        cur.execute("SELECT count(*) AS n FROM conveyor_attempts")
        assert cur.fetchone()["n"] == 1
        cur.execute("SELECT count(*) AS n FROM conveyor_jobs_dropped")
        assert cur.fetchone()["n"] == 0
    assert set(_keys(backend)) == {"r4"}
    # The next pass makes no day before the last one made (RANGE partitions only
    # grow): the dropped day's range went to the next day's partition, which is
    # dropped once all of it is past. A job finished now goes to a day, not to
    # the catch-all.
    backend._days_made_at = float("-inf")
    backend.job_prune(state="succeeded", older_than_s=7 * 86400.0)
    backend.job_insert_many(jobs=[ins(args=["next"])])
    late = fetch(backend, n=2)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(j) for j in late])
    assert {_where(backend, j.id) for j in late} == {f"succeeded_{_tomorrow()}"}


def test_a_day_holding_a_job_of_an_open_batch_is_kept(backend):
    """As row by row retention keeps the jobs of an open batch, a day that holds
    one is not dropped; its other jobs go row by row."""
    batch_id, _ = backend.batch_create(
        name=None,
        task="t",
        idempotency_key=None,
        on_complete_json=None,
        jobs=[ins(args=[i]) for i in range(2)],
    )
    backend.job_insert_many(jobs=[ins(args=["alone"])])
    jobs = fetch(backend, n=3)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(j) for j in jobs])
    week = _a_week_on()
    assert backend.job_prune(state="succeeded", older_than_s=7 * 86400.0, now=week) == 1
    assert f"succeeded_{_today()}" in _partitions(backend)
    kept = [j for j in jobs if backend.job_get(job_id=j.id) is not None]
    assert len(kept) == 2 and all(backend.job_get(job_id=j.id).batch_id == batch_id for j in kept)
    assert backend.batch_progress(batch_id=batch_id) == {"succeeded": 2}


def test_partition_upkeep_gives_up_while_the_table_is_in_use(backend):
    """A transaction holding the table (its metadata lock) makes the day's drop
    wait UPKEEP_WAIT_S, then skip to a later pass: it never fails the prune."""
    backend.job_insert_many(jobs=[ins(args=[1])])
    [job] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job)])
    conn = pymysql.connect(**backend._kwargs, autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM conveyor_jobs")
        week = _a_week_on()
        started = time.monotonic()
        gone = backend._partition_upkeep(
            "job_drop_days",
            {"state": "succeeded", "older_than_s": 7 * 86400.0, "now": backend._now(week)},
        )
        assert gone == 0 and time.monotonic() - started < 10
    finally:
        conn.rollback()
        conn.close()
    assert backend.job_get(job_id=job.id) is not None
    assert _counts(backend) == {"succeeded": 1}


def test_claims_read_the_live_partition_only(backend):
    """The hot statements name part = 0: MariaDB prunes every finished day."""
    with backend._tx() as cur:
        cur.execute(
            "EXPLAIN PARTITIONS " + backend.Q["job_claim_pick"],
            {
                "queue": "q",
                "now": None,
                "schema_version": backend.latest_schema,
                "tasks": None,
                "task_list": (None,),
                "limit": 1,
            },
        )
        rows = cur.fetchall()
    assert {r["partitions"] for r in rows if r["table"] == "conveyor_jobs"} == {"live"}, rows
