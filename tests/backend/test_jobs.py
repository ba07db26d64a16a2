"""JobStore: creating jobs, reading them by filter, and the operator's actions."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from conveyor.backends.interfaces import JobStore
from conveyor.records import Finalize, JobFilter

from ..conftest import only_on
from .helpers import done, fetch, ins, later, raw_connection

# -- inserting --------------------------------------------------------------------------


def test_insert_then_get_round_trips(backend):
    [res] = backend.job_insert_many(
        jobs=[
            ins(
                args=[1, "x"], priority=3, max_attempts=7, timeout_s=2.5, backoff_json='{"base": 1}'
            )
        ]
    )
    assert res.created
    job = backend.job_get(job_id=res.id)
    assert (job.task, job.queue, job.args, job.state) == ("t", "q", [1, "x"], "available")
    assert (job.priority, job.max_attempts, job.timeout, job.attempts) == (3, 7, 2.5, 0)
    assert job.backoff == {"base": 1}
    assert backend.job_get(job_id=res.id + 1000) is None


def _stored(backend, job_id: int) -> dict:
    """A job as read back, but the fields that differ between two inserts."""
    varying = {"id", "created_at", "scheduled_at"}
    record = dataclasses.asdict(backend.job_get(job_id=job_id))
    return {k: v for k, v in record.items() if k not in varying}


@pytest.mark.parametrize("delay_s", [0.0, 30.0])
def test_one_job_is_stored_as_in_a_chunk(backend, delay_s):
    """PostgreSQL writes a lone plain job with a statement of its own (scalars, no
    arrays): every column must come out as the chunk statement writes it."""
    job = ins(
        args=[1, {"k": "v"}],
        priority=4,
        max_attempts=6,
        delay_s=delay_s,
        timeout_s=1.5,
        backoff_json='{"base": 2.0}',
        stage="second",
        context_json='{"step": 2}',
        chain_json='[{"task": "t", "args": [], "kwargs": {}}]',
        chain_root=7,
        tenant="acme",
        explicit=3,
    )
    [alone] = backend.job_insert_many(jobs=[job])
    chunk = backend.job_insert_many(
        jobs=[job, job._replace(args_json='{"args": [], "kwargs": {}}')]
    )
    assert _stored(backend, alone.id) == _stored(backend, chunk[0].id)
    assert _stored(backend, alone.id)["state"] == ("scheduled" if delay_s else "available")


#: a lone send goes straight through libpq on PostgreSQL alone
on_libpq_send = only_on("postgres")


@on_libpq_send
def test_a_lone_send_survives_the_server_forgetting_its_statement(backend):
    """PostgreSQL prepares a lone send's statement once on each connection. When
    the server no longer has it (DEALLOCATE ALL, a pooler's other session), the
    send prepares it again: the job is sent once, and nothing raises."""

    def prepared(conn) -> set[str]:
        return {r["name"] for r in conn.execute("SELECT name FROM pg_prepared_statements")}

    backend.job_insert_many(jobs=[ins(args=[1])])
    with backend.pool.connection() as conn:  # the one the send used: the pool is LIFO
        assert "conveyor_send_one" in prepared(conn)
        conn.execute("DEALLOCATE ALL", prepare=False)
        assert "conveyor_send_one" not in prepared(conn)
        pid = conn.info.backend_pid
    [again] = backend.job_insert_many(jobs=[ins(args=[2])])
    with backend.pool.connection() as conn:
        assert conn.info.backend_pid == pid  # the same session, so the path was taken
        assert "conveyor_send_one" in prepared(conn)
    assert backend.job_get(job_id=again.id).args == [2]
    assert backend.job_count(filter=JobFilter(queues=("q",)))["available"] == 2


@pytest.mark.parametrize("field", ["tenant", "stage"])
@on_libpq_send
def test_a_lone_send_with_a_nul_is_refused_whole(backend, field):
    """libpq ends a text parameter at a NUL byte, so such a send goes through
    psycopg, which refuses it as for a chunk: nothing is stored cut short."""
    for jobs in ([ins(**{field: "a\x00b"})], [ins(**{field: "a\x00b"}), ins()]):
        with pytest.raises(psycopg.DataError):
            backend.job_insert_many(jobs=jobs)
    assert not any(backend.job_count(filter=JobFilter(queues=("q",))).values())


@on_libpq_send
def test_a_lone_send_fails_with_the_error_a_chunk_gets(backend):
    """The server's error for a lone send is psycopg's class for its SQLSTATE, as
    when psycopg runs the statement (a value out of an int column's range)."""
    for jobs in ([ins(priority=2**40)], [ins(priority=2**40), ins()]):
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            backend.job_insert_many(jobs=jobs)
    [ok] = backend.job_insert_many(jobs=[ins(priority=2**31 - 1, args=["after"])])
    assert backend.job_get(job_id=ok.id).priority == 2**31 - 1


@pytest.mark.parametrize("delay_s", [0.0, 30.0])
def test_a_stream_of_jobs_is_stored_as_one_statement_stores_it(backend, delay_s):
    """job_insert_stream (PostgreSQL: COPY text rows the backend formats) writes
    every column as job_insert_many does, text COPY must escape included, and
    gives ids in input order; jobs with keys or limits are refused, not written."""
    odd = "tab\tnl\ncr\r back\\slash \\N é"
    job = ins(
        args=[1, {"k": odd}],
        priority=4,
        max_attempts=6,
        delay_s=delay_s,
        timeout_s=1.5,
        backoff_json='{"base": 2.0}',
        stage=f"second {odd}",
        context_json='{"step": "\\t"}',
        chain_json='[{"task": "t", "args": [], "kwargs": {}}]',
        chain_root=7,
        tenant=odd,
        explicit=3,
    )
    others = [job._replace(args_json=f'{{"args": [{i}], "kwargs": {{}}}}') for i in range(5)]
    [single] = backend.job_insert_many(jobs=[job])
    streamed = backend.job_insert_stream(chunks=iter([[job, *others[:2]], [], others[2:]]))
    assert [r.created for r in streamed] == [True] * 6
    assert [r.id for r in streamed] == sorted(r.id for r in streamed)
    assert _stored(backend, streamed[0].id) == _stored(backend, single.id)
    assert [backend.job_get(job_id=r.id).args for r in streamed[1:]] == [[i] for i in range(5)]
    assert _stored(backend, single.id)["state"] == ("scheduled" if delay_s else "available")
    first = backend.job_get(job_id=streamed[0].id)
    assert first.scheduled_at - first.created_at == timedelta(seconds=delay_s)
    keyed = ins(args=[9])._replace(unique_key="u")
    before = backend.job_count(filter=JobFilter())
    if type(backend).job_insert_stream is not JobStore.job_insert_stream:
        with pytest.raises(ValueError, match="without keys or limits"):
            backend.job_insert_stream(chunks=[[ins(args=[8])], [keyed]])
        assert backend.job_count(filter=JobFilter()) == before


def test_a_stream_that_starts_now_keeps_the_delays_of_later_jobs(backend):
    """PostgreSQL leaves the times of a stream whose first job starts now to column
    defaults (schema v18); a later job with a delay still gets its due time."""
    start = backend.changes_head()
    now, soon, late = ins(args=[0]), ins(args=[1], delay_s=30.0), ins(args=[2], delay_s=90.0)
    streamed = backend.job_insert_stream(chunks=iter([[now, soon], [now, late, now]]))
    jobs = [backend.job_get(job_id=r.id) for r in streamed]
    assert [j.args for j in jobs] == [[0], [1], [0], [2], [0]]
    assert [r.id for r in streamed] == sorted(r.id for r in streamed)
    assert [j.state for j in jobs] == [
        "available", "scheduled", "available", "scheduled", "available"
    ]  # fmt: skip
    waits = [(j.scheduled_at - j.created_at).total_seconds() for j in jobs]
    assert waits == [0.0, 30.0, 0.0, 90.0, 0.0]
    assert len({j.created_at for j in jobs}) == 1  # one transaction, one moment
    # the change stamp (a column default too) puts them in the event stream
    from .test_changes import all_changes

    changed, _ = all_changes(backend, start, expect=len(streamed))
    assert sorted(c.job.id for c in changed if c.job) == sorted(r.id for r in streamed)


@only_on("postgres")  # COPY and its id sequence are PostgreSQL's
def test_a_stream_with_gaps_in_its_ids_gives_each_job_its_own(backend):
    """PostgreSQL reads a COPY's ids as one span (count, first, last) when they
    are consecutive; when they are not (another writer took ids from the sequence
    in between; here the sequence steps by 3), it reads them one by one."""
    with raw_connection(backend) as conn:
        conn.execute(
            "DO $$ BEGIN EXECUTE format('ALTER SEQUENCE %s INCREMENT BY 3', "
            "pg_get_serial_sequence('conveyor_jobs', 'id')); END $$"
        )
    streamed = backend.job_insert_stream(chunks=iter([[ins(args=[i]) for i in range(7)]]))
    ids = [r.id for r in streamed]
    assert [b - a for a, b in itertools.pairwise(ids)] == [3] * 6
    assert [backend.job_get(job_id=i).args for i in ids] == [[i] for i in range(7)]
    consecutive = backend.job_insert_stream(chunks=iter([[ins(args=[i]) for i in range(3)]]))
    assert [backend.job_get(job_id=r.id).args for r in consecutive] == [[0], [1], [2]]


def test_insert_many_returns_ids_in_input_order(backend):
    results = backend.job_insert_many(jobs=[ins(args=[i]) for i in range(50)])
    assert [backend.job_get(job_id=r.id).args for r in results] == [[i] for i in range(50)]


@pytest.mark.parametrize("limited", [False, True])
def test_a_claimed_job_is_the_job_read_back(backend, limited):
    """Claims decode their rows by position (no dict per row), reads by name: both
    must give the same record, field for field, for a queue with limits too."""
    if limited:
        backend.queue_set_limit(name="q", max_running=10)
    kw = {"concurrency_key": "user=1", "concurrency_limit": 5} if limited else {}
    backend.job_insert_many(
        jobs=[
            ins(
                args=[i, {"k": "v"}],
                priority=i,
                max_attempts=6,
                timeout_s=1.5,
                backoff_json='{"base": 2.0}',
                tenant="acme",
                **kw,
            )
            for i in range(3)
        ]
    )
    claimed = fetch(backend)
    assert len(claimed) == 3
    for job in claimed:
        assert dataclasses.asdict(job) == dataclasses.asdict(backend.job_get(job_id=job.id))
    assert [j.priority for j in claimed] == [2, 1, 0]


def test_delayed_job_is_scheduled_and_claimable_only_when_due(backend):
    [res] = backend.job_insert_many(jobs=[ins(delay_s=60)])
    assert backend.job_get(job_id=res.id).state == "scheduled"
    assert fetch(backend) == []
    assert [j.id for j in fetch(backend, now=later(61))] == [res.id]


def test_unique_key_allows_one_unfinished_job(backend):
    first, again = backend.job_insert_many(jobs=[ins(unique_key="k"), ins(unique_key="k")])
    assert first.created and not again.created and again.id == first.id
    [job] = fetch(backend)
    assert backend.job_insert_many(jobs=[ins(unique_key="k")])[0].id == first.id  # running
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job)])
    fresh = backend.job_insert_many(jobs=[ins(unique_key="k")])[0]
    assert fresh.created and fresh.id != first.id


def test_idempotency_key_returns_the_same_job_forever(backend):
    [first] = backend.job_insert_many(jobs=[ins(idempotency_key="req-1")])
    [job] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job)])
    [again] = backend.job_insert_many(jobs=[ins(idempotency_key="req-1"), ins()])[:1]
    assert (again.id, again.created) == (first.id, False)


def test_racing_inserts_of_one_key_make_one_job(backend):
    results: list = []
    barrier = threading.Barrier(8)

    def race() -> None:
        barrier.wait()
        results.extend(backend.job_insert_many(jobs=[ins(idempotency_key="race")]))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.id for r in results}) == 1
    assert sum(r.created for r in results) == 1


def test_insert_joins_the_callers_transaction(backend):
    conn = raw_connection(backend)
    try:
        [rolled] = backend.job_insert_many(jobs=[ins(args=["rolled back"])], conn=conn)
        conn.rollback()
        assert backend.job_get(job_id=rolled.id) is None
        [kept] = backend.job_insert_many(jobs=[ins(args=["committed"])], conn=conn)
        conn.commit()
        assert backend.job_get(job_id=kept.id).args == ["committed"]
        # several at once (SQLite: one executemany, then the ids it made)
        many = backend.job_insert_many(jobs=[ins(args=[i]) for i in range(3)], conn=conn)
        conn.rollback()
        assert [backend.job_get(job_id=r.id) for r in many] == [None] * 3
        many = backend.job_insert_many(jobs=[ins(args=[i]) for i in range(3)], conn=conn)
        conn.commit()
        assert [backend.job_get(job_id=r.id).args for r in many] == [[0], [1], [2]]
    finally:
        conn.close()


# -- reading by filter --------------------------------------------------------------------
def test_list_filters_and_pages_newest_first(backend):
    backend.job_insert_many(
        jobs=[
            ins(task="a", queue="x", args=["alpha"]),
            ins(task="b", queue="x", tenant="acme"),
            ins(task="a", queue="y", args=["beta 100%"], stage="s2"),
        ]
    )
    ids = lambda **kw: [j.task + j.queue for j in backend.job_list(filter=JobFilter(**kw))]  # noqa: E731
    assert ids(tasks="a") == ["ay", "ax"]
    assert ids(queues=["x"]) == ["bx", "ax"]
    assert ids(tenant="acme") == ["bx"]
    assert ids(stage="s2") == ["ay"]
    assert ids(search="ALPHA") == ["ax"]  # inside the arguments, case insensitive
    assert ids(search="100%") == ["ay"]  # % and _ are literal
    assert ids(search="10_%") == []
    assert ids(states="available", tasks=["a", "b"], queues="x") == ["bx", "ax"]
    newest = backend.job_list(filter=JobFilter(), limit=1)[0]
    assert len(backend.job_list(filter=JobFilter(), before_id=newest.id)) == 2


def test_list_by_time_range_and_ids(backend):
    _a, b = backend.job_insert_many(jobs=[ins(), ins()])
    [job] = fetch(backend, n=1)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job)])
    now = datetime.now(UTC)
    f = JobFilter(created_after=now - timedelta(minutes=1), created_before=now + timedelta(1))
    assert len(backend.job_list(filter=f)) == 2
    assert backend.job_list(filter=JobFilter(created_after=now + timedelta(minutes=1))) == []
    fin = JobFilter(finished_after=now - timedelta(minutes=1))
    assert [j.id for j in backend.job_list(filter=fin)] == [job.id]
    assert [j.id for j in backend.job_list(filter=JobFilter(ids=[b.id, 999_999]))] == [b.id]


def test_list_by_idempotency_keys(backend):
    a, _b, c = backend.job_insert_many(
        jobs=[ins(idempotency_key="k-a"), ins(idempotency_key="k-b"), ins(idempotency_key="k-c")]
    )
    backend.job_insert_many(jobs=[ins(unique_key="k-a")])  # a unique key is another key
    f = JobFilter(idempotency_keys=["k-c", "k-a", "k-none"])
    assert [j.id for j in backend.job_list(filter=f)] == [c.id, a.id]
    assert backend.job_count(filter=f) == {"available": 2}
    assert JobFilter(idempotency_keys="k-a").idempotency_keys == ("k-a",)


def test_count_is_per_state(backend):
    backend.job_insert_many(jobs=[ins(), ins(), ins(delay_s=60)])
    assert backend.job_count(filter=JobFilter()) == {"available": 2, "scheduled": 1}
    due = JobFilter(states=["available", "scheduled"], due_before=datetime.now(UTC))
    assert backend.job_count(filter=due) == {"available": 2}
    backend.queue_set_paused(name="q", paused=True)
    assert backend.job_count(filter=JobFilter(unpaused=True)) == {}


def test_attempts_are_listed_oldest_first(backend):
    backend.job_insert_many(jobs=[ins(max_attempts=3)])
    [job] = fetch(backend)
    retry = done(job, state="scheduled", outcome="retry", error="x", retry_in_s=0)
    backend.job_finalize_many(worker_id="w1", outcomes=[retry])
    [again] = fetch(backend, now=later(1))
    backend.job_finalize_many(worker_id="w2", outcomes=[done(again)])
    got = [(a.attempt, a.outcome, a.worker_id) for a in backend.job_attempts(job_id=job.id)]
    assert got == [(1, "retry", "w1"), (2, "succeeded", "w2")]
    success = backend.job_attempts(job_id=job.id)[-1]
    assert success.started_at is not None and success.finished_at is not None
    # a success re-sent after a broken connection is recognised as already written
    assert backend.job_outcome_written(outcome=done(again), worker_id="w2")
    assert not backend.job_outcome_written(outcome=done(again), worker_id="w1")


def test_a_success_is_logged_by_the_job_row_alone(backend):
    """From schema v12 a succeeded attempt writes no attempt row: the job row keeps
    its worker, and the log reads from both, once."""
    backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(job)])
    with raw_connection(backend) as conn:
        rows = conn.execute("SELECT count(*) FROM conveyor_attempts").fetchone()[0]
    assert rows == 0
    [only] = backend.job_attempts(job_id=job.id)
    assert (only.attempt, only.outcome, only.worker_id) == (1, "succeeded", "w1")
    assert backend.job_get(job_id=job.id).lease_owner == "w1"


# -- operator actions ----------------------------------------------------------------------
def test_cancel_many_cancels_waiting_jobs_and_flags_running_ones(backend):
    a, b, c = backend.job_insert_many(jobs=[ins(), ins(delay_s=60), ins(task="other")])
    [running] = fetch(backend, n=1)
    assert running.id == a.id
    cancelled, flagged = backend.job_cancel_many(filter=JobFilter(tasks="t"))
    assert (cancelled, flagged) == ([b.id], [a.id])
    assert backend.job_get(job_id=b.id).state == "cancelled"
    assert backend.job_get(job_id=a.id).cancel_requested
    assert backend.job_get(job_id=c.id).state == "available"
    assert backend.job_cancel_many(filter=JobFilter(tasks="t")) == ([], [])  # once


def test_retry_many_gives_failed_and_cancelled_jobs_another_attempt(backend):
    a, b, c = backend.job_insert_many(jobs=[ins(max_attempts=1) for _ in range(3)])
    ja, jb = fetch(backend, n=2)
    backend.job_finalize_many(worker_id="w1", outcomes=[done(ja, state="failed", error="x")])
    backend.job_finalize_many(worker_id="w1", outcomes=[done(jb)])
    backend.job_cancel_many(filter=JobFilter(ids=[c.id]))
    assert sorted(backend.job_retry_many(filter=JobFilter())) == [a.id, c.id]
    got = backend.job_get(job_id=a.id)
    assert (got.state, got.max_attempts) == ("available", 2)
    assert backend.job_get(job_id=b.id).state == "succeeded"
    assert backend.job_retry_many(filter=JobFilter()) == []  # nothing failed any more


def test_retry_many_works_in_bounded_slices(backend):
    backend.job_insert_many(jobs=[ins() for _ in range(5)])
    backend.job_cancel_many(filter=JobFilter())
    assert len(backend.job_retry_many(filter=JobFilter(), limit=2)) == 2
    assert len(backend.job_retry_many(filter=JobFilter(), limit=2)) == 2
    assert len(backend.job_retry_many(filter=JobFilter(), limit=2)) == 1


def test_retrying_a_job_cancelled_while_running_forgets_the_cancel(backend):
    backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend)
    backend.job_cancel_many(filter=JobFilter(ids=[job.id]))
    backend.job_finalize_many(
        worker_id="w1", outcomes=[done(job, state="cancelled", error="cancelled while running")]
    )
    assert backend.job_retry_many(filter=JobFilter(ids=[job.id])) == [job.id]
    [again] = fetch(backend)
    assert not backend.job_get(job_id=again.id).cancel_requested


def test_delete_many_spares_running_jobs(backend):
    _a, b = backend.job_insert_many(jobs=[ins(), ins()])
    [running] = fetch(backend, n=1)
    assert backend.job_delete_many(filter=JobFilter()) == [b.id]
    assert backend.job_get(job_id=b.id) is None
    assert backend.job_get(job_id=running.id).state == "running"


def test_an_outcome_committed_before_a_lost_connection_is_recognised(backend):
    backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend)
    outcome = done(job)
    assert not backend.job_outcome_written(outcome=outcome, worker_id="w1")
    backend.job_finalize_many(worker_id="w1", outcomes=[outcome])
    # sent again after the connection broke: refused by fencing, but recognised
    assert backend.job_finalize_many(worker_id="w1", outcomes=[outcome]) == []
    assert backend.job_outcome_written(outcome=outcome, worker_id="w1")
    assert not backend.job_outcome_written(outcome=outcome, worker_id="w2")


@pytest.mark.parametrize("field", ["states"])
def test_unknown_filter_values_are_refused(field):
    from conveyor.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown job state"):
        JobFilter(**{field: "done"})


def test_finalize_keeps_the_stage_it_ran(backend):
    backend.job_insert_many(jobs=[ins()])
    [job] = fetch(backend)
    stage = Finalize(job.id, job.lease_token, "available", "stage", next_stage="two")
    backend.job_finalize_many(worker_id="w1", outcomes=[stage])
    assert backend.job_get(job_id=job.id).stage == "two"
