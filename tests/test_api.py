"""The public producer API, on both backends."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable

import psycopg
import pymysql
import pytest

from conveyor import (
    ConfigError,
    Conveyor,
    JobFilter,
    JobNotFound,
    JobState,
    KeyReused,
    SerializationError,
)


def _connect(app: Conveyor):
    backend = app.backend
    if backend.name == "postgres":
        return psycopg.connect(backend.url)
    if backend.name == "mysql":
        from conveyor.backends.mysql.backend import parse_url

        return pymysql.connect(**parse_url(backend.url))
    return sqlite3.connect(backend.path)


@pytest.fixture
def send_email(app):
    @app.task(queue="emails", max_attempts=5, timeout=30)
    async def send_email(to: str, body: str = "") -> dict:
        return {"to": to}

    return send_email


def test_send_returns_a_handle_that_reads_fresh(app, send_email):
    job = send_email.send("a@b.c", body="hi")
    assert job.state == "available" and job.state is JobState.AVAILABLE
    got = app.get_job(job.id)
    assert (got.task, got.queue, got.args, got.kwargs) == (
        "send_email",
        "emails",
        ["a@b.c"],
        {"body": "hi"},
    )
    assert (got.max_attempts, got.timeout, got.attempts, got.result, got.error) == (
        5,
        30,
        0,
        None,
        None,
    )
    assert job.refresh() == got
    with pytest.raises(JobNotFound):
        app.get_job(job.id + 999)


def test_asend_and_send_many(app, send_email):
    job = asyncio.run(send_email.asend("x@y.z", body="async"))
    many = send_email.send_many([("a@b.c", "x"), ("d@e.f", "y"), {"to": "k@w.z"}])
    assert [app.get_job(j.id).args for j in many] == [["a@b.c", "x"], ["d@e.f", "y"], []]
    assert app.get_job(many[2].id).kwargs == {"to": "k@w.z"}
    assert app.get_job(job.id).kwargs == {"body": "async"}
    with pytest.raises(TypeError, match="tuple of positional arguments"):
        send_email.send_many(["not-a-tuple"])


def test_options_bind_send_options_to_a_task(app, send_email):
    """``task.options(...)``: the typed way to pass send options. They apply to
    ``send``, ``asend`` and ``s`` as keywords of ``send`` do, a bad one is refused
    when named, and ``conn`` joins the caller's transaction."""
    urgent = send_email.options(priority=7, queue="urgent", max_attempts=2)
    job = urgent.send("a@b.c", body="now")
    later = asyncio.run(urgent.asend("d@e.f"))
    step = urgent.s("g@h.i")
    for got in (app.get_job(job.id), app.get_job(later.id)):
        assert (got.priority, got.queue, got.max_attempts) == (7, "urgent", 2)
    assert app.get_job(job.id).kwargs == {"body": "now"}
    assert step.options == {"priority": 7, "queue": "urgent", "max_attempts": 2}
    assert send_email.options(priority=1).send("x", priority=3).priority == 3
    with pytest.raises(ConfigError, match="max_attempts"):
        send_email.options(max_attempts=0)
    conn = _connect(app)
    try:
        kept = send_email.options(conn=conn).send("in@tx.c")
        conn.rollback()
    finally:
        conn.close()
    with pytest.raises(JobNotFound):
        app.get_job(kept.id)
    # tenant: an option of options() only (a handler may have a parameter so named)
    acme = send_email.options(tenant="acme")
    sent = [acme.send("t@b.c", body="x"), asyncio.run(acme.asend("u@b.c"))]
    assert [app.get_job(j.id).tenant for j in sent] == ["acme", "acme"]
    assert app.get_job(sent[0].id).kwargs == {"body": "x"}
    with pytest.raises(ConfigError, match=r"options\(\), not of send\(\): send_email.options"):
        send_email.send("v@b.c", tenant="acme")  # type: ignore[call-arg]


#: a job's fields that a read gives back as they were sent (not id, args, times)
_SENT_FIELDS = (
    "queue", "task", "state", "priority", "max_attempts", "timeout", "backoff",
    "tenant", "stage", "batch_id", "kwargs", "attempts", "unique_key", "idempotency_key",
)  # fmt: skip


def test_send_many_past_one_chunk_stores_what_one_chunk_does(app, send_email):
    """Past STREAM_CHUNK items send_many goes out in chunks (PostgreSQL writes them
    by COPY, formatting its own text rows): every job reads back as a one-chunk call
    stores it, text that COPY escapes included, ids follow the input order, and the
    handles match what a read gives."""
    from conveyor.task import STREAM_CHUNK

    odd = 'tab\there\nnew\r "q" back\\slash \\N é 𝄞 \\u0000 not a NUL'
    items = [(f"{i}@x.y", odd if i % 3 == 0 else str(i)) for i in range(2 * STREAM_CHUNK + 7)]
    options = {"delay": 30, "priority": 3, "tenant": "t\\N 1\\t", "timeout": 7.5, "max_attempts": 2}
    many = send_email.send_many(items, **options)
    few = send_email.send_many(items[:2], **options)
    assert [j.created for j in many] == [True] * len(items)
    ids = [j.id for j in many]
    assert ids == sorted(ids) and len(set(ids)) == len(items) and few[0].id > ids[-1]
    one = app.get_job(few[0].id)
    for job, item in zip(many, items, strict=True):
        stored = app.get_job(job.id)
        assert stored.args == list(item) == job.args
        for name in _SENT_FIELDS:
            assert getattr(stored, name) == getattr(one, name) == getattr(job, name), name
        assert stored.scheduled_at - stored.created_at == one.scheduled_at - one.created_at
    assert one.state == "scheduled" and one.tenant == "t\\N 1\\t" and one.priority == 3
    now = send_email.send_many([("n@w.z",)] * (STREAM_CHUNK + 1))  # available: workers woken
    assert {app.get_job(j.id).state for j in now} == {JobState.AVAILABLE}


def test_send_many_failing_in_a_later_chunk_enqueues_nothing(app, send_email):
    from conveyor.task import STREAM_CHUNK

    def total() -> int:
        return sum(c.count for c in app.counts())

    before = total()
    items: list = [("a@b.c", "x")] * (2 * STREAM_CHUNK + 3)
    with pytest.raises(TypeError, match=f"item {2 * STREAM_CHUNK + 1} for task"):
        send_email.send_many([*items[:-2], "not-a-tuple", items[-1]])
    with pytest.raises(SerializationError, match="Nothing was enqueued"):
        send_email.send_many([*items, ("a@b.c", {1, 2})])
    assert total() == before
    assert len(send_email.send_many(items)) == len(items) and total() == before + len(items)


def test_a_bulk_send_leaves_the_garbage_collector_as_it_found_it(app, send_email, monkeypatch):
    """A bulk send pauses cyclic collection while it runs (its handles set off
    collections that walk them all again): on, off, and after a failed send."""
    import gc
    import threading

    from conveyor.task import STREAM_CHUNK

    items = [("a@b.c",)] * (3 * STREAM_CHUNK)
    seen: list[bool] = []
    #: per thread, what its send does when the stream encodes its third chunk
    midway: dict[int, Callable[[], object]] = {}
    encode = send_email._inserts

    def encoding(part, template, start=0):  # each chunk of a stream, as it is written
        if start == 2 * STREAM_CHUNK:
            midway.get(threading.get_ident(), lambda: seen.append(gc.isenabled()))()
        return encode(part, template, start)

    monkeypatch.setattr(send_email, "_inserts", encoding)
    assert gc.isenabled()
    send_email.send_many(items)
    assert seen == [False] and gc.isenabled()
    with pytest.raises(TypeError, match="item"):
        send_email.send_many([*items, "not-a-tuple"])
    assert gc.isenabled()
    gc.disable()
    try:
        send_email.send_many(items)
        assert not gc.isenabled()  # the caller's choice stands
    finally:
        gc.enable()
    # Two at once: the first turns it back on when it ends, the other still
    # running (overlapping sends never keep it off for good).
    gates = [(threading.Event(), threading.Event()) for _ in range(2)]

    def slow(inside: threading.Event, release: threading.Event) -> None:
        midway[threading.get_ident()] = lambda: (inside.set(), release.wait(10))
        send_email.send_many(items)

    threads = []
    for inside, release in gates:
        t = threading.Thread(target=slow, args=(inside, release))
        t.start()
        threads.append(t)
        assert inside.wait(10)
    assert not gc.isenabled()  # both sends run
    gates[0][1].set()
    threads[0].join(10)
    assert gc.isenabled() and threads[1].is_alive()
    gates[1][1].set()
    threads[1].join(10)
    assert gc.isenabled() and not threads[1].is_alive()


def test_send_options(app, send_email):
    a = send_email.send("a", delay=60, priority=5, unique_key="welcome:42")
    b = send_email.send("a", unique_key="welcome:42")
    assert a.id == b.id and app.get_job(a.id).state == "scheduled"
    c = send_email.send("a", idempotency_key="req-123")
    d = send_email.send("a", idempotency_key="req-123")  # a retry
    assert c.id == d.id and not d.created and d.args == ["a"]  # the original job, read back
    assert app.get_job(a.id).priority == 5


def test_an_idempotency_key_names_one_call(app, send_email):
    """A key reused for other arguments or another task is refused (KeyReused) and
    writes nothing, by every door: send, enqueue by name, many jobs at once; a key
    named by another item of the same call too. Options are not compared, nor
    arguments the task declared sensitive: a repeat never tells whether a guessed
    secret matched."""
    first = send_email.send("a", body="x", idempotency_key="k")
    before = app.count_jobs()
    for call in (
        lambda: send_email.send("b", body="x", idempotency_key="k"),
        lambda: send_email.send("a", body="y", idempotency_key="k"),
        lambda: app.enqueue("resize", ["a"], idempotency_key="k"),
        lambda: app.enqueue("send_email", ["b"], {"body": "x"}, idempotency_key="k"),
    ):
        with pytest.raises(KeyReused, match=rf"'k' was already used .*job {first.id}, task"):
            call()
    assert app.enqueue("send_email", ["a"], {"body": "x"}, idempotency_key="k").id == first.id
    assert send_email.send("a", body="x", priority=9, idempotency_key="k").id == first.id
    # send_many: nothing written when one item reuses a key for something else
    with pytest.raises(KeyReused, match=r"jobs\[0\] of the same call") as caught:
        app.plumbing.insert_jobs(
            [
                send_email.build(["c"], {"body": "1"}, idempotency_key="m"),
                send_email.build(["c"], {"body": "2"}, idempotency_key="m"),
            ]
        )
    assert caught.value.index == 1
    assert app.count_jobs() == before

    @app.task(sensitive=("password",))
    def login(user: str, password: str) -> None: ...

    job = login.send("ada", "hunter2", idempotency_key="acct-ada")
    for guess in ("password1", "hunter2"):  # the same answer, right or wrong
        again = login.send("ada", guess, idempotency_key="acct-ada")
        assert (again.id, again.created) == (job.id, False)
    with pytest.raises(KeyReused):  # what is not sensitive still counts
        login.send("bob", "hunter2", idempotency_key="acct-ada")


def test_a_send_without_options_gets_the_defaults_after_one_with_options(app, send_email):
    """The no-options template is made once and kept: options of other sends
    never leak into it."""
    assert send_email.template() is send_email.template()
    assert send_email.template(priority=2) is not send_email.template()
    with pytest.raises(ConfigError, match="unknown send option"):
        send_email.template(colour="red")
    first = send_email.send("a")
    send_email.send("b", priority=5, delay=60, max_attempts=2, queue="other", timeout=3)
    plain = app.get_job(send_email.send("c").id)
    assert (plain.queue, plain.priority, plain.max_attempts, plain.timeout) == ("emails", 0, 5, 30)
    assert plain.state == app.get_job(first.id).state == "available"


def test_send_inside_the_callers_transaction(app, send_email):
    conn = _connect(app)
    try:
        send_email.send("rolled@back", conn=conn)
        conn.rollback()
        kept = send_email.send("kept@it", conn=conn)
        conn.commit()
    finally:
        conn.close()
    # (SQLite hands the rolled-back id out again, so compare contents, not ids)
    assert [j.args for j in app.list_jobs()] == [["kept@it"]]
    assert app.get_job(kept.id).args == ["kept@it"]


def test_bulk_sends_in_one_callers_transaction_get_their_own_ids(app, send_email):
    """PostgreSQL writes a bulk insert without keys by COPY and reads the ids back
    by the transaction's stamp: jobs the same transaction wrote before must not
    come back as the later call's."""
    conn = _connect(app)
    try:
        first = send_email.send("first", conn=conn)
        a = send_email.send_many([(f"a{i}",) for i in range(300)], conn=conn)
        b = send_email.send_many([(f"b{i}",) for i in range(250)], conn=conn)
        conn.commit()
    finally:
        conn.close()
    ids = [first.id] + [j.id for j in a + b]
    assert len(set(ids)) == 551 and ids == sorted(ids)
    assert [app.get_job(j.id).args for j in a + b] == [[f"a{i}"] for i in range(300)] + [
        [f"b{i}"] for i in range(250)
    ]


def test_a_workflow_starts_inside_the_callers_transaction(app, send_email):
    def build(name):
        wf = app.workflow(name)
        first = wf.add(send_email.s("a@b.c"))
        wf.map(send_email.s(), over=first)
        return wf

    conn = _connect(app)
    try:
        build("rolled-back").start(conn=conn)
        conn.rollback()
        kept = build("kept").start(conn=conn)
        conn.commit()
    finally:
        conn.close()
    assert [w.name for w in app.list_workflows()] == ["kept"]
    assert [n.state for n in kept.nodes()] == ["running", "pending"]
    assert [j.args for j in app.list_jobs()] == [["a@b.c"]]


def test_conn_of_the_wrong_kind_is_refused(app, send_email, tmp_path):
    other = sqlite3.connect(tmp_path / "other.db")
    try:
        with pytest.raises(ConfigError, match="conn="):
            send_email.send("x", conn=other)
    finally:
        other.close()
    assert app.counts() == []


def test_enqueue_by_name_checks_registered_tasks_and_sends_others(app, send_email):
    job = app.enqueue("send_email", ["a@b.c"], {"body": "x"})
    assert app.get_job(job.id).kwargs == {"body": "x"}
    with pytest.raises(ConfigError, match="bad arguments for task 'send_email'"):
        app.enqueue("send_email", [1, 2, 3, 4])
    # a task with no handler here: enqueued with default options, for other workers
    remote = app.enqueue("resize", ["img.png"], {"w": 10}, queue="images", tenant="acme")
    got = app.get_job(remote.id)
    assert (got.task, got.queue, got.args, got.kwargs, got.tenant) == (
        "resize",
        "images",
        ["img.png"],
        {"w": 10},
        "acme",
    )
    with pytest.raises(ConfigError, match="task name"):
        app.enqueue("")
    # arguments of the wrong shape: said so, nothing written (a string was its letters)
    before = app.count_jobs()
    for args, kwargs, said in [
        ("a.png", None, r"args of task 'resize': a list or tuple .* str 'a.png': pass \['a.png'\]"),
        ({"w": 1}, None, "got dict .*keyword arguments go in kwargs"),
        (["a.png"], "w=1", "kwargs of task 'resize': a dict of keyword arguments, got str"),
    ]:
        with pytest.raises(ConfigError, match=said):
            app.enqueue("resize", args, kwargs)  # type: ignore[arg-type]
    assert app.count_jobs() == before
    # the task object where its name goes: said so, and how to send it
    with pytest.raises(ConfigError, match=r"takes the task's name, 'send_email'.*send_email\.send"):
        app.enqueue(send_email, ["a@b.c"])  # type: ignore[arg-type]


def test_retry_and_cancel_through_the_app(app, send_email):
    job = send_email.send("a", delay=60)
    assert app.cancel_job(job.id) == "cancelled"
    assert app.get_job(job.id).state == "cancelled"
    assert app.retry_job(job.id) is True
    assert app.get_job(job.id).state == "available"


def test_newer_schema_is_refused_without_auto_migrate(db_url):
    app = Conveyor(db_url, auto_migrate=False)
    with pytest.raises(Exception, match="conveyor migrate"):
        _ = app.backend
    app.close()


def test_newer_schema_is_refused_even_without_auto_migrate(db_url, monkeypatch):
    from conveyor import SchemaError
    from conveyor.backends.sql.loader import Migration

    Conveyor(db_url).migrate()
    app = Conveyor(db_url, auto_migrate=False)
    backend_class = type(app.backend)
    app.close()
    # pretend this code knows no migration at all: the database is then "newer"
    monkeypatch.setattr(backend_class, "MIGRATIONS", [Migration(0, "none", "")])
    with pytest.raises(SchemaError, match="upgrade the conveyor package"):
        _ = Conveyor(db_url, auto_migrate=False).backend
    with pytest.raises(SchemaError, match="upgrade the conveyor package"):
        Conveyor(db_url).migrate()


def test_enqueue_keeps_handler_kwargs_apart_from_options(app):
    @app.task
    def flexible(**kwargs):
        return kwargs

    job = app.enqueue("flexible", [], {"delay": "not an option"}, priority=3)
    got = app.get_job(job.id)
    assert (
        got.kwargs == {"delay": "not an option"} and got.priority == 3 and got.state == "available"
    )


def test_racing_calls_under_one_key_write_nothing_for_the_one_refused(app, send_email):
    """Two calls at once, each a job of its own and a job under a shared key with
    other arguments: one wins; the other is refused (KeyReused) and its own job is
    not written either (the key is checked in the transaction that writes)."""
    for n in range(12):
        barrier = threading.Barrier(2)
        outcome: dict[str, object] = {}

        def call(
            side: str,
            n: int = n,
            barrier: threading.Barrier = barrier,
            outcome: dict[str, object] = outcome,
        ) -> None:
            inserts = [
                send_email.build([f"extra-{side}-{n}"], {}),
                send_email.build([side], {}, idempotency_key=f"race-{n}"),
            ]
            barrier.wait()
            try:
                app.plumbing.insert_jobs(inserts)
                outcome[side] = "written"
            except KeyReused:
                outcome[side] = "refused"

        threads = [threading.Thread(target=call, args=(side,)) for side in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(outcome.values()) == ["refused", "written"], outcome
        loser = next(side for side, what in outcome.items() if what == "refused")
        found = app.list_jobs(JobFilter(search=f"extra-{loser}-{n}"))
        assert found == [], f"round {n}: the refused call's other job was written"


def test_a_wait_that_times_out_says_what_holds_the_job_back(app, send_email):
    """No worker serves the job's queue: the timeout says so (why_waiting), for the
    sync wait and the async one."""
    job = send_email.send("a@b.c")
    said = "still available after 0.2s: no live worker takes queue 'emails' and task 'send_email'"
    with pytest.raises(TimeoutError, match=said):
        job.wait(timeout=0.2)
    with pytest.raises(TimeoutError, match=said):
        asyncio.run(job.await_result(timeout=0.2))


def test_the_longest_keys_are_stored_whole_and_longer_ones_refused(app, send_email):
    """Tenants and limit keys of up to 255 characters, unique and idempotency keys
    of up to 512, are stored whole on every database and found again by the whole
    key; a longer one is refused before anything is written. (MariaDB's columns
    hold those lengths, and its inserts that skip conflicts cut a longer value
    short: a tenant cut to 255 characters, a key that no longer found its job.)"""
    from conveyor.checks import MAX_LIMIT_KEY, MAX_UNIQUE_KEY

    @app.task(queue="emails", concurrency_key=lambda to: to, concurrency_limit=1, name="keyed")
    def keyed(to: str) -> None: ...

    tenant, key = "t" * MAX_LIMIT_KEY, "k" * MAX_UNIQUE_KEY
    job = send_email.options(tenant=tenant).send("a", idempotency_key=key)
    assert app.get_job(job.id).tenant == tenant
    again = send_email.options(tenant=tenant).send("a", idempotency_key=key)
    assert (again.id, again.created) == (job.id, False)
    unique = send_email.send("b", unique_key="u" * MAX_UNIQUE_KEY)
    assert app.get_job(unique.id).unique_key == "u" * MAX_UNIQUE_KEY
    limited = keyed.send("c" * MAX_LIMIT_KEY)
    assert app.get_job(limited.id).concurrency_key == "c" * MAX_LIMIT_KEY
    before = app.counts()
    refused = [
        lambda: send_email.options(tenant=tenant + "t").send("a"),
        lambda: send_email.send("a", idempotency_key=key + "k"),
        lambda: send_email.send("a", unique_key=key + "u"),
        lambda: keyed.send("c" * (MAX_LIMIT_KEY + 1)),
        lambda: send_email.batch([("a",)], idempotency_key=key + "k"),
        lambda: app.workflow("w", idempotency_key=key + "k"),
    ]
    for call in refused:
        with pytest.raises(ConfigError, match="at most"):
            call()
    assert app.counts() == before
