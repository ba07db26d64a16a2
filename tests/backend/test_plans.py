"""Query plans of the maintenance queries that run on every pass of the leader:
they go through their partial indexes, never a scan of the job table.

The plans are read without statistics or parameter values: SQLite plans without
ANALYZE, and a prepared statement on PostgreSQL may run its generic plan, where a
parameter (``state = $1``) cannot prove a partial index's predicate.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from ..conftest import only_on
from .helpers import done, fetch, ins, keyed_claim_params, pg_setting

# (query, the index its plan must use)
PLANNED = [
    ("job_prune_ids", "conveyor_jobs_finished_idx"),
    ("job_chain_due", "conveyor_jobs_chain_due_idx"),
    # priority aging reads windows of waiting time per queue; the fetch index
    # orders by priority first, so without this one each window read the queue
    ("job_age_priorities", "conveyor_jobs_waiting_idx"),
    ("queue_oldest_waiting", "conveyor_jobs_waiting_idx"),
]


def _sqlite_plan(backend: Any, name: str) -> str:
    class Params(dict[str, Any]):
        def __missing__(self, key: str) -> Any:
            return 1

    with backend._tx() as cur:
        cur.execute("EXPLAIN QUERY PLAN " + backend.Q[name], Params(state="succeeded"))
        return "\n".join(str(r["detail"]) for r in cur.fetchall())


def _pg_plan(backend: Any, name: str) -> str:
    names: list[str] = []

    def positional(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    sql = re.sub(r"%\((\w+)\)s", positional, backend.Q[name])
    with backend._tx() as cur:
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute("SET LOCAL enable_seqscan = off")  # an index that fits is taken
        cur.execute(f"PREPARE conveyor_plan_probe AS {sql}")
        known = {"state": "'succeeded'", "older_than_s": "1"}
        values = [known.get(n, "NULL") for n in names]
        args = f"({', '.join(values)})" if names else ""
        cur.execute(f"EXPLAIN EXECUTE conveyor_plan_probe{args}")
        plan = "\n".join(str(next(iter(r.values()))) for r in cur.fetchall())
        cur.execute("DEALLOCATE conveyor_plan_probe")
    return plan


def _pg_index_names(backend: Any, index: str) -> list[str]:
    """The index and, for an index of the partitioned job table, its partitions'."""
    with backend._tx() as cur:
        cur.execute(
            "SELECT c.relname FROM pg_partition_tree(to_regclass(%s)) t "
            "JOIN pg_class c ON c.oid = t.relid",
            [index],
        )
        return [str(r["relname"]) for r in cur.fetchall()] or [index]


@pytest.mark.parametrize(("query", "index"), PLANNED)
@only_on("sqlite", "postgres")  # MySQL has no partial indexes: its queries use generated columns
def test_maintenance_queries_use_their_partial_index(backend, db_url, query, index):
    if db_url.startswith("sqlite"):
        plan = _sqlite_plan(backend, query)
        assert index in plan, plan
    else:  # an index of the partitioned table is one per partition (schema v17)
        plan = _pg_plan(backend, query)
        assert any(name in plan for name in _pg_index_names(backend, index)), plan
    assert not re.search(r"^(SCAN j|SCAN conveyor_jobs)$", plan, re.M), plan
    assert "Seq Scan on conveyor_jobs" not in plan, plan


@only_on("sqlite")  # PostgreSQL's rescue plan is checked with its hot paths below
def test_the_rescue_reads_running_jobs_only_on_sqlite(backend, db_url):
    """The leader's rescue runs every second under SQLite's write lock: it must
    read the running jobs through their partial indexes, not walk the table by
    rowid (one OR'd condition ordered by id did: 41 ms a pass at 120,000
    finished jobs, every claim and completion waiting behind it)."""
    plan = _sqlite_plan(backend, "job_expired_leases")
    assert "conveyor_jobs_lease_idx" in plan and "conveyor_jobs_owner_idx" in plan, plan
    assert not re.search(r"^SCAN (j|conveyor_jobs)$", plan, re.M), plan


class _RollBack(Exception):
    pass


def _pg_analyze(backend: Any, name: str, params: dict[str, Any], *settings: str) -> str:
    """EXPLAIN ANALYZE of a statement as the backend sends it, rolled back (after
    ``settings``, statements such as ``SET LOCAL ...``)."""
    lines: list[str] = []
    try:
        with backend._tx() as cur:
            for setting in settings:
                cur.execute(setting)
            cur.execute("EXPLAIN ANALYZE " + backend.Q[name], backend._params(params))
            lines = [str(next(iter(r.values()))) for r in cur.fetchall()]
            raise _RollBack
    except _RollBack:
        pass
    return "\n".join(lines)


def _walked(plan: str) -> int:
    """The most rows any join of the plan compared and threw away."""
    return max((int(n) for n in re.findall(r"Rows Removed by Join Filter: (\d+)", plan)), default=0)


@only_on("postgres")  # plans of PostgreSQL's set-based claim and completion
def test_hot_paths_find_jobs_by_id_when_statistics_are_stale(backend, db_url):
    """Right after a table was analyzed empty and then filled (a new install, a
    bulk enqueue before autovacuum's next ANALYZE), a claim and a completion still
    touch only their own jobs: they name them by id, an index condition, instead
    of trusting the planner's estimate of a nearly empty table."""
    from conveyor.backends.postgres.backend import _finalize_params
    from conveyor.records import Finalize

    # A table emptied by retention or a purge and analyzed while empty: pages
    # on disk, no live rows in the statistics (density 0: "1 row" whatever the size)
    backend.job_insert_many(jobs=[ins(queue="old", args=[i]) for i in range(2000)])
    with backend._tx() as cur:
        cur.execute("DELETE FROM conveyor_jobs")
    with backend._tx() as cur:
        cur.execute("ANALYZE conveyor_jobs")
    app_insert = [
        backend.job_insert_many(jobs=[ins(args=[i]) for i in range(k, k + 500)])
        for k in range(0, 2000, 500)
    ]
    assert sum(len(r) for r in app_insert) == 2000
    claim = _pg_analyze(
        backend,
        "job_claim",
        {
            "worker_id": "w",
            "lease_s": None,
            "now": None,
            "tasks": None,
            "schema_version": backend.latest_schema,
            "queues": ["q"],
            "limit": 100,
        },
    )
    assert "rows=100 loops=1" in claim, claim
    assert _walked(claim) < 1000, claim
    jobs = backend.job_claim(queues=["q"], worker_id="w", limit=100)
    assert len(jobs) == 100
    outcomes = [
        Finalize(job_id=j.id, token=str(j.lease_token), state="succeeded", outcome="succeeded")
        for j in jobs
    ]
    done = _pg_analyze(backend, "job_finalize_many", _finalize_params("w", outcomes, None))
    # Only the batch's own jobs: at most each outcome against every other. (Since
    # the live partition of schema v17, a 1-row estimate for the 100 ids makes the
    # planner loop over the outcomes once per job, 9,900 comparisons for 100, where
    # it hashed them before; bounded by the batch, never by the jobs waiting.)
    assert _walked(done) <= len(outcomes) ** 2, done
    assert "Seq Scan on conveyor_jobs" not in done, done
    # the leader's rescue reads the running jobs (a partial index), not every job
    rescue = _pg_analyze(backend, "job_rescue", {"worker_ttl_s": 60.0, "limit": 100, "now": None})
    assert "conveyor_jobs_owner_idx on conveyor_jobs_live j" in rescue, rescue
    assert "Seq Scan on conveyor_jobs" not in rescue, rescue


@only_on("postgres")  # the plan of PostgreSQL's limited claim
def test_limited_claim_reads_its_window_in_index_order(backend, db_url):
    """A limited claim's candidates come off the fetch index in order, the walk
    stopping after the window: an ordered path exists and is taken once a sort is
    costed out. (The candidates used to be joined to a one-row CTE for the time;
    under some statistics, on a table full of dead rows, the planner then put that
    CTE outside the index scan, lost its order and sorted 12,100 waiting jobs per
    claim, 13 ms instead of 6. This test did not reproduce those statistics; it
    guards the ordered walk, which a reordering of the query could lose.)"""
    backend.job_insert_many(
        jobs=[ins(args=[i], concurrency_key=f"u{i % 50}", concurrency_limit=2) for i in range(3000)]
    )
    # enable_sort off: an ordered path is taken, if there is one
    plan = _pg_analyze(
        backend, "job_claim_candidates", keyed_claim_params(backend), "SET LOCAL enable_sort = off"
    )
    assert "rows=200 loops=1" in plan, plan  # the window: twice the claim
    assert not re.search(r"Sort Key: j_?\d*\.priority DESC", plan), plan
    scanned = re.search(
        r"Index Scan using conveyor_jobs_fetch_idx on conveyor_jobs_live j\S* .*rows=(\d+)", plan
    )
    assert scanned and int(scanned.group(1)) <= 200, plan


def test_a_keyed_claim_counts_running_keys_by_their_index(backend, db_url):
    """The running jobs of the candidates' keys are counted through the running-key
    index (v15), which holds running jobs with keys only: not by reading every
    running job of every queue."""
    if db_url.startswith("sqlite"):
        plan = _sqlite_plan(backend, "job_claim_limited")
        assert "conveyor_jobs_running_key_idx" in plan, plan
        return
    if db_url.startswith("mysql"):
        with backend._tx() as cur:
            cur.execute("EXPLAIN " + backend.Q["limits_busy"], {"keys": ("u1", "u2")})
            plan = str(cur.fetchall())
        assert "conveyor_jobs_running_key_idx" in plan, plan
        return
    keyed = backend.job_insert_many(
        jobs=[ins(args=[i], concurrency_key=f"u{i % 50}", concurrency_limit=2) for i in range(500)]
    )
    backend.job_insert_many(jobs=[ins(queue="other", args=[i]) for i in range(500)])
    backend.job_claim(queues=["other"], worker_id="w", limit=500)  # running, unkeyed
    ids = [r.id for r in keyed][:200]  # the window job_claim_candidates would lock
    plan = _pg_analyze(backend, "job_claim_limited", keyed_claim_params(backend, ids=ids))
    assert "conveyor_jobs_running_key_idx" in plan, plan
    assert "rows=100 loops=1" in plan, plan
    # where keys alone limit, the claim takes the candidates' keys as arrays
    keys = {
        "keys": [f"u{i % 50}" for i in range(200)],
        "limits": [2] * 200,
        "ords": list(range(1, 201)),
    }
    plan = _pg_analyze(backend, "job_claim_keyed", keyed_claim_params(backend, ids=ids, **keys))
    assert "conveyor_jobs_running_key_idx" in plan, plan
    assert "rows=100 loops=1" in plan, plan  # two of each key's four candidates


@only_on("postgres")  # the session's claim function (job_claim_limited_function)
def test_a_keyed_claim_counts_running_keys_by_probes_inside_its_function(backend, db_url):
    """Inside the limited claim's function the statements run generic plans, whose
    estimates are guesses (a parameter array of "10" candidates, "1" running job):
    a join of the running jobs with the candidates became a nested loop comparing
    every running job with every candidate. Each key probes the index instead."""
    from conveyor.backends.postgres.dialect import CLAIM_LIMITED_FUNCTION

    backend.job_insert_many(
        jobs=[ins(args=[i], concurrency_key=f"u{i}", concurrency_limit=2) for i in range(300)]
    )
    assert len(backend.job_claim(queues=["q"], worker_id="w", limit=100)) == 100  # 100 run
    plans: list[str] = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: plans.append(str(d.message_primary)))
        for setting in (
            "LOAD 'auto_explain'",
            "SET auto_explain.log_min_duration = 0",
            "SET auto_explain.log_analyze = on",
            "SET auto_explain.log_nested_statements = on",
            "SET auto_explain.log_level = notice",
            "SET client_min_messages = notice",
        ):
            conn.execute(setting)
        conn.execute(CLAIM_LIMITED_FUNCTION)
        params = keyed_claim_params(backend, factor=1, queue_lock=False)
        claimed = conn.execute(backend.Q["job_claim_limited_call"], backend._params(params))
        assert len(claimed.fetchall()) == 100
    [claim] = [p for p in plans if "Update on conveyor_jobs" in p]
    assert "conveyor_jobs_running_key_idx" in claim, claim
    assert "loops=100" in claim, claim  # a probe per candidate's key
    assert _walked(claim) < 1000, claim  # not 100 running x 100 candidates


@only_on("postgres")  # PostgreSQL's bitmap scans
def test_a_limited_claims_transaction_counts_running_jobs_without_bitmap_scans(backend, db_url):
    """A queue's running jobs are counted through a partial index on the running
    state, which keeps an entry for every job that ran since the last VACUUM. Only a
    plain index scan marks the dead entries it meets so that the next count skips
    them; a bitmap scan, which the planner chose for the count late in a drain of
    20,000 jobs, visited all of them again in every claim (0.8 ms; 0.1 ms without).
    The limited claim's lock statement turns bitmap scans off for its transaction,
    and for that transaction only."""
    backend.queue_set_limit(name="q", max_running=1000)
    backend.job_insert_many(jobs=[ins(args=[i]) for i in range(200)])
    ran = fetch(backend, 100, worker="w1")
    backend.job_finalize_many(worker_id="w1", outcomes=[done(j) for j in ran])
    with backend.pool.connection() as conn:
        with conn.transaction():
            conn.execute(backend.Q["limits_lock"], {"queue": "q", "queue_lock": True})
            assert pg_setting(conn, "enable_bitmapscan") == "off"
            plan = "\n".join(
                str(next(iter(r.values())))
                for r in conn.execute(
                    "EXPLAIN " + backend.Q["queue_running"], backend._params({"queue": "q"})
                )
            )
            assert "Bitmap" not in plan, plan
        assert pg_setting(conn, "enable_bitmapscan") == "on"
    assert len(fetch(backend, 100, worker="w1")) == 100  # the limited claim still claims


def _mysql_plan(backend: Any, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with backend._tx() as cur:
        cur.execute("EXPLAIN PARTITIONS " + backend.Q[name], params)
        return [dict(r) for r in cur.fetchall()]


@only_on("mysql")  # no partial indexes: a virtual column and the partitions (schema v25)
def test_mysql_maintenance_reads_the_time_index_in_the_partitions_it_needs(backend, db_url):
    """Promotion and retention read the time index (due time while scheduled, finish
    time once finished) of only the partitions that can hold their jobs: a claim
    never writes that index, and retention never reads another state's jobs."""
    backend.job_insert_many(jobs=[ins(args=[i]) for i in range(50)])
    backend.job_insert_many(jobs=[ins(args=[i], delay_s=60) for i in range(50)])
    ran = fetch(backend, 40)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(j) for j in ran[:30]])
    backend.job_finalize_many(worker_id="w1", outcomes=[done(j, "failed") for j in ran[30:]])
    now = {"now": None}
    due = _mysql_plan(backend, "job_schedule_pick", {**now, "limit": 100})
    assert [(r["key"], r["partitions"]) for r in due] == [("conveyor_jobs_time_idx", "live")], due
    for state in ("succeeded", "failed", "cancelled"):
        params = {**now, "state": state, "older_than_s": 0.0, "limit": 100}
        for name in ("job_prune_ids", "job_prune_count"):
            jobs = [r for r in _mysql_plan(backend, name, params) if r["table"] == "j"]
            assert len(jobs) == 1, jobs
            parts = str(jobs[0]["partitions"]).split(",")
            assert parts and all(p.startswith(f"{state}_") for p in parts), jobs
    # a batch's live jobs: its entries in the live partition's batch index
    ready = [r for r in _mysql_plan(backend, "batch_ready", {"limit": 10}) if r["table"] == "j"]
    assert [(r["key"], r["partitions"]) for r in ready] == [("conveyor_jobs_batch_idx", "live")], (
        ready
    )


@only_on("mysql")  # InnoDB locks the rows a locking read examines; PostgreSQL those it returns
def test_mysql_claims_read_only_their_own_queue(backend, db_url):
    """A claim walks its own queue's entries of the fetch index. InnoDB locks each
    row a locking read examines, if only until the row is found not to match, and
    a concurrent claim's SKIP LOCKED passes over such a row: on a small table the
    optimizer read every job through the spread index instead, so a claim on one
    queue (the server's internal worker, woken by the same insert) made a claim
    on another come back empty while its job waited."""
    backend.job_insert_many(jobs=[ins(queue="default", args=[1])])
    base = {
        "now": None,
        "schema_version": backend.latest_schema,
        "tasks": 1,
        "task_list": ("conveyor.bulk_action",),
        "limit": 1,
    }
    pick = _mysql_plan(backend, "job_claim_pick", {**base, "queue": "conveyor"})
    jobs = [r for r in pick if r["table"] == "conveyor_jobs"]
    assert [r["key"] for r in jobs] == ["conveyor_jobs_fetch_idx"], pick
    params = {**keyed_claim_params(backend, queue="conveyor"), **base, "identity": ("w",)}
    cands = [r for r in _mysql_plan(backend, "job_claim_candidates", params) if r["table"] == "j"]
    assert [r["key"] for r in cands] == ["conveyor_jobs_fetch_idx"], cands


@pytest.mark.parametrize("query", ["job_copy_begin", "job_copy_span", "job_copy_ids"])
@only_on("postgres")  # the job table's partitions (schema v17)
def test_a_bulk_enqueue_reads_only_the_live_partition(backend, db_url, query):
    """A ``send_many`` by COPY finds the rows it wrote by the transaction's change
    stamp, which is not the partition key: its statements say the jobs are not
    finished, or each plan and run probes every day of finished jobs too."""
    plan = _pg_plan(backend, query)
    assert "conveyor_jobs_live" in plan, plan
    assert not re.search(r"conveyor_jobs_(succeeded|failed|cancelled)", plan), plan
