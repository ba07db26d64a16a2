"""Issue 36, item 1: a payload nested too deeply is refused where it is encoded,
by every way of sending one, and nothing is stored; a handler's result or
context nested too deeply fails its job, saying so; what was accepted is stored
by every backend (MariaDB keeps no JSON deeper than 31 levels); and a job stored
past these checks (by SQL, or an older version) is shown as unreadable, never
breaks a list, and is failed unrun by a worker. Real workers in threads."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor import Conveyor, NextStage, SerializationError, chain, current_job
from conveyor.encoding import MAX_DEPTH, READ_DEPTH
from conveyor.records import JobState
from tests.poison import deep_json, poison

from .helpers import Running, finished, wait_for


def deep(depth: int) -> Any:
    """``depth`` lists inside each other (``deep(2) == [[1]]``)."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def total(app) -> int:
    return sum(app.count_jobs().values())


def test_every_way_to_send_refuses_a_payload_nested_too_deeply_and_stores_nothing(app):
    @app.task
    def take(*args: Any, **kwargs: Any) -> None:
        return None

    too_deep = deep(MAX_DEPTH + 1)
    refusals = {
        "args[1] of task": lambda: take.send(1, too_deep),
        "kwargs['k'] of task": lambda: take.send(k={"x": too_deep}),
        "item 2: args[0]": lambda: take.send_many([(1,), (2,), (too_deep,)]),
        "item 1: kwargs['k']": lambda: take.batch([(1,), {"k": too_deep}], name="b"),
        "args[0] of task 'elsewhere'": lambda: app.enqueue("elsewhere", [too_deep]),
        "the context of task": lambda: app.enqueue("elsewhere", [], context=too_deep),
        "args[0] of task 'take'": lambda: chain(take.s(1), take.s(too_deep)),
    }
    for where, send in refusals.items():
        with pytest.raises(SerializationError) as refused:
            send()
        text = str(refused.value)
        assert where in text and f"more than {MAX_DEPTH} levels deep" in text, (where, text)
        assert "Nothing was enqueued" in text
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(SerializationError, match=r"args\[0\] of task 'take' nests .* itself"):
        take.send(cycle)
    assert total(app) == 0  # nothing stored, not even the first items of a batch
    # the limit itself is accepted, everywhere
    take.send(deep(MAX_DEPTH), k=deep(MAX_DEPTH))
    take.send_many([(deep(MAX_DEPTH),)] * 2)
    take.batch([(deep(MAX_DEPTH),)], name="b")
    app.enqueue("elsewhere", [deep(MAX_DEPTH)], context=deep(MAX_DEPTH))
    assert total(app) == 5


def test_what_is_accepted_is_stored_and_run_by_every_backend(app):
    """At the limit: an argument, a result, and the deepest Conveyor wraps a value
    itself (a chain's later step's arguments; a result passed on to the next step)."""

    @app.task
    def echo(value: Any) -> Any:
        return value

    @app.task
    def pair(first: Any, second: Any) -> list[Any]:
        return [len(str(first)), len(str(second))]

    limit = deep(MAX_DEPTH)
    c = chain(echo.s(limit), pair.s(limit))  # pair(<echo's result>, limit)
    with Running(app):
        assert c.result(timeout=60) == [len(str(limit))] * 2
    first = app.get_job(c.id)
    assert first.state == JobState.SUCCEEDED and first.result == limit and first.args == [limit]


def test_a_result_or_context_nested_too_deeply_fails_its_job_saying_so(app):
    @app.task(max_attempts=3)
    def result(depth: int) -> Any:
        return deep(depth)

    @app.task(max_attempts=3)
    def staged(depth: int) -> Any:
        if current_job().stage is None:
            return NextStage("second", context={"k": deep(depth)})
        return "done"

    jobs = [result.send(MAX_DEPTH + 1), staged.send(MAX_DEPTH), result.send(MAX_DEPTH)]
    with Running(app):
        wait_for(finished(app, *(j.id for j in jobs)), what="the jobs finished")
    failed, too_deep_context, fine = (app.get_job(j.id) for j in jobs)
    assert failed.state == JobState.FAILED and failed.attempts == 1
    assert f"the result nests lists and dicts more than {MAX_DEPTH} levels deep" in failed.error
    assert too_deep_context.state == JobState.FAILED
    assert f"the context nests lists and dicts more than {MAX_DEPTH}" in too_deep_context.error
    assert fine.state == JobState.SUCCEEDED and fine.result == deep(MAX_DEPTH)
    assert len(app.list_jobs()) == 3


def test_a_stored_job_that_cannot_be_read_is_marked_and_failed_unrun(app, db_url):
    ran: list[Any] = []

    @app.task
    def record(value: Any) -> None:
        ran.append(value)

    good, bad, other = record.send(1), record.send(2), record.send(3)
    # deeper than json.loads goes (it used to raise at whoever listed the jobs)
    poison(db_url, bad.id, args='{"args": [' + deep_json(5000) + '], "kwargs": {}}')
    listed = {j.id: j for j in app.list_jobs()}
    assert set(listed) == {good.id, bad.id, other.id}
    marked = listed[bad.id]
    assert marked.unreadable == f"args: nested more than {READ_DEPTH} levels deep"
    assert (marked.args, marked.kwargs) == ([], {})
    assert listed[good.id].unreadable is None and listed[good.id].args == [1]
    if db_url.startswith("mysql:"):
        # MariaDB keeps such a row out (its JSON CHECK); with the check turned off,
        # as poison() does, the claim's UPDATE of that row fails the check itself
        return
    with Running(app):
        wait_for(finished(app, good.id, bad.id, other.id), what="the jobs finished")
    assert sorted(ran) == [1, 3]  # the handler never saw the unreadable job
    failed = app.get_job(bad.id)
    assert failed.state == JobState.FAILED and failed.attempts == 1
    assert failed.error.startswith("not run: the job's data cannot be read back (args: nested")
    assert app.job_attempts(bad.id)[0].outcome == "failed"


@pytest.mark.parametrize(
    ("column", "text", "why"),
    [
        ("args", '{"args": [1, ', "not valid JSON"),
        ("args", '{"args": [NaN], "kwargs": {}}', "NaN is not a JSON value"),
        ("args", '{"args": ["\\ud800"], "kwargs": {}}', "lone surrogate"),
        ("args", "[1, 2]", "not an arguments document"),
        ("result", deep_json(READ_DEPTH + 1), f"more than {READ_DEPTH} levels deep"),
        ("context", '{"k": ', "not valid JSON"),
    ],
)
def test_what_sqlite_may_hold_and_json_may_not_is_marked_unreadable(tmp_path, column, text, why):
    """SQLite keeps any text in a JSON column (PostgreSQL's jsonb and MariaDB's
    CHECK refuse these)."""
    url = f"sqlite:///{tmp_path / 'held.db'}"
    with Conveyor(url) as app:
        job = app.enqueue("elsewhere", [1])
        poison(url, job.id, **{column: text})
        [read] = app.list_jobs()
        assert read.unreadable is not None and read.unreadable.startswith(f"{column}: ")
        assert why in read.unreadable
        assert app.get_job(job.id).unreadable == read.unreadable
