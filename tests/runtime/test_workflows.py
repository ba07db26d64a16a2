"""Workflows run by a real worker, on every backend: fan-out, fan-in, map,
failure propagation, cancel and retry."""

from __future__ import annotations

import threading

import pytest

from conveyor import PARENT_FAILED, ConfigError, Permanent, WorkflowFailed
from conveyor.errors import KeyReused

from .helpers import Running, wait_for


def _tasks(app, calls):
    @app.task
    def fetch(url):
        calls.append(("fetch", url))
        return {"url": url, "pages": [1, 2, 3]}

    @app.task
    def parse(doc):
        calls.append(("parse", doc["url"]))
        return doc["pages"]

    @app.task
    def thumbs(doc):
        calls.append(("thumbs", doc["url"]))
        return "thumbs"

    @app.task
    async def resize(page, scale=2):
        calls.append(("resize", page))
        return page * scale

    @app.task
    def store(parts):
        calls.append(("store", parts))
        return {"stored": parts}

    return fetch, parse, thumbs, resize, store


def test_the_graph_of_the_issue_runs_each_node_once_with_its_parents_results(app):
    calls: list = []
    fetch, parse, thumbs, resize, store = _tasks(app, calls)
    wf = app.workflow("ingest", idempotency_key="req-9")
    a = wf.add(fetch.s("http://x"))
    b = wf.add(parse.s(), after=[a])
    c = wf.add(thumbs.s(), after=[a])
    m = wf.map(resize.s(scale=10), over=b)
    d = wf.add(store.s(), after=[b, c, m])
    run = wf.start()
    assert run.created and run.state == "running"
    with Running(app, concurrency=4, flow_poll_s=0.2):
        assert run.wait(timeout=30) == "succeeded"
    assert run.result(d) == {"stored": [[1, 2, 3], "thumbs", [10, 20, 30]]}
    assert run.result(m) == [10, 20, 30] and run.result("parse") == [1, 2, 3]
    names = sorted(c[0] for c in calls)
    assert names == ["fetch", "parse", "resize", "resize", "resize", "store", "thumbs"]
    nodes = run.nodes()
    assert [(n.name, n.kind, n.state) for n in nodes] == [
        ("fetch", "task", "succeeded"),
        ("parse", "task", "succeeded"),
        ("thumbs", "task", "succeeded"),
        ("resize", "map", "succeeded"),
        ("store", "task", "succeeded"),
    ]
    assert nodes[3].items == 3 and [i.result for i in run.items(m)] == [10, 20, 30]
    assert all(app.get_job(n.job_id).state == "succeeded" for n in nodes if n.kind == "task")
    # the key names this run: asking again returns it and writes nothing
    again = app.workflow("ingest", idempotency_key="req-9")
    again.add(fetch.s("http://x"))
    with pytest.raises(KeyReused):
        again.start()
    assert app.list_workflows()[0].id == run.id and len(app.list_workflows()) == 1


def test_a_repeat_under_the_same_key_gets_the_same_run(app):
    calls: list = []
    fetch, *_ = _tasks(app, calls)

    def build():
        wf = app.workflow("one", idempotency_key="k1")
        wf.add(fetch.s("u"))
        return wf.start()

    first, second = build(), build()
    assert (first.id, first.created, second.created) == (first.id, True, False)
    assert second.id == first.id and sum(app.count_jobs().values()) == 1


def test_a_failed_node_cancels_its_dependents_and_fails_the_run(app):
    @app.task(max_attempts=1)
    def boom():
        raise Permanent("no")

    @app.task
    def ok():
        return 1

    @app.task
    def after(x):
        return x

    @app.task
    def cleanup(x):
        return x

    @app.task
    def maybe(x):
        return "ran"

    wf = app.workflow("fails")
    bad = wf.add(boom.s())
    good = wf.add(ok.s())
    dep = wf.add(after.s(), after=[bad])
    deeper = wf.add(after.s(), after=[dep], name="deeper")
    fin = wf.add(cleanup.s(), after=[bad, good], on_parent_failure="run")
    skip = wf.add(maybe.s(), after=[bad], on_parent_failure="skip")
    below_skip = wf.add(maybe.s(), after=[skip], name="below-skip")
    run = wf.start()
    with Running(app, concurrency=2, flow_poll_s=0.2):
        assert run.wait(timeout=30) == "failed"
    states = {n.name: n.state for n in run.nodes()}
    assert states == {
        "boom": "failed",
        "ok": "succeeded",
        "after": "cancelled",
        "deeper": "cancelled",
        "cleanup": "succeeded",
        "maybe": "skipped",
        "below-skip": "succeeded",
    }
    marker, one = run.result(fin)
    assert one == 1 and marker[PARENT_FAILED]["node"] == "boom"
    assert "no" in marker[PARENT_FAILED]["error"]
    assert run.node(dep).error == "parent 'boom' failed"
    assert run.node(deeper).error == "parent 'after' cancelled"
    assert run.result(below_skip) == "ran" and run.result(skip) is None
    assert run.record().error.startswith("boom: ")
    with pytest.raises(WorkflowFailed, match="cancelled"):
        run.result(deeper)


def test_retry_runs_again_only_what_did_not_succeed(app):
    runs = {"ok": 0, "flaky": 0, "after": 0, "item": []}
    healed = threading.Event()

    @app.task
    def ok():
        runs["ok"] += 1
        return [1, 2, 3, 4]

    @app.task(max_attempts=1)
    def item(x):
        runs["item"].append(x)
        if x == 3 and not healed.is_set():
            raise Permanent("three")
        return x * 2

    @app.task
    def total(xs):
        runs["after"] += 1
        return sum(xs)

    wf = app.workflow("retry")
    a = wf.add(ok.s())
    m = wf.map(item.s(), over=a)
    t = wf.add(total.s(), after=[m])
    run = wf.start()
    with Running(app, concurrency=2, flow_poll_s=0.2):
        assert run.wait(timeout=30) == "failed"
        assert run.node(m).state == "failed" and "1 of 4 items" in run.node(m).error
        assert run.node(t).state == "cancelled"
        with pytest.raises(ConfigError, match="still running"):
            run2 = app.workflow("other")
            run2.add(ok.s())
            started = run2.start()
            app.retry_workflow(started.id)
        healed.set()
        assert run.retry() == 2  # the map (its failed item) and total
        assert run.wait(timeout=30) == "succeeded"
        started.wait(timeout=30)
    assert run.result(t) == 20
    assert runs["ok"] == 2  # once here, once for the other workflow
    assert sorted(runs["item"]) == [1, 2, 3, 3, 4]
    assert run.record().round == 1


def test_cancel_stops_what_has_not_run(app):
    gate = threading.Event()

    @app.task
    def slow():
        gate.wait(20)
        return 1

    @app.task
    def later(x):
        return x

    wf = app.workflow("cancel-me")
    s = wf.add(slow.s())
    wf.add(later.s(), after=[s])
    run = wf.start()
    with Running(app, concurrency=1, flow_poll_s=0.2):
        wait_for(lambda: app.get_job(run.node(s).job_id).state == "running", what="running")
        assert run.cancel() is True
        gate.set()
        assert run.wait(timeout=30) == "cancelled"
    assert run.cancel() is False
    states = [n.state for n in run.nodes()]
    assert states[1] == "cancelled" and states[0] in ("cancelled", "succeeded")


def test_map_over_an_empty_list_and_over_a_non_list(app):
    @app.task
    def empty():
        return []

    @app.task
    def scalar():
        return 5

    @app.task
    def each(x):
        return x

    @app.task
    def fin(xs):
        return ["got", xs]

    wf = app.workflow("edges")
    e = wf.add(empty.s())
    me = wf.map(each.s(), over=e)
    f = wf.add(fin.s(), after=[me])
    s = wf.add(scalar.s())
    wf.map(each.s(), over=s, name="bad-map")
    run = wf.start()
    with Running(app, concurrency=2, flow_poll_s=0.2):
        assert run.wait(timeout=30) == "failed"
    assert run.result(f) == ["got", []]
    bad = run.node("bad-map")
    assert bad.state == "failed" and "its result is int" in bad.error


def test_declaration_errors_name_the_problem(app):
    @app.task
    def one(x=None):
        return x

    wf = app.workflow("bad")
    other = app.workflow("other")
    n = other.add(one.s())
    with pytest.raises(ConfigError, match="not a node of workflow"):
        wf.add(one.s(), after=[n])
    with pytest.raises(ConfigError, match="on_parent_failure"):
        wf.add(one.s(), on_parent_failure="maybe")
    a = wf.add(one.s())
    with pytest.raises(ConfigError, match="has a node 'one'"):
        wf.add(one.s(), name="one")
    with pytest.raises(ConfigError, match="a map cannot run"):
        wf.map(one.s(), over=a, on_parent_failure="run")
    # A default name steps around a name given earlier: never two nodes of one name.
    named = app.workflow("names")
    nodes = [named.add(one.s()), named.add(one.s(), name="one-2"), named.add(one.s())]
    nodes.append(named.add(one.s()))
    assert [x.name for x in nodes] == ["one", "one-2", "one-3", "one-4"]
    with pytest.raises(ConfigError, match="no nodes"):
        app.workflow("empty").start()
    with pytest.raises(ConfigError, match="state"):
        app.list_workflows(state="nope")


def test_old_workflows_go_with_their_retention_and_a_node_job_takes_no_chain_step(app):
    from datetime import UTC, datetime, timedelta

    from conveyor.runtime.maintenance import Maintenance

    @app.task
    def one(x=None):
        return 1

    wf = app.workflow("old")
    a = wf.add(one.s())
    run = wf.start()
    with pytest.raises(ConfigError, match="node of a workflow"):
        app.get_job(run.node(a).job_id).then(one.s())
    with Running(app, flow_poll_s=0.2):
        assert run.wait(timeout=30) == "succeeded"
    keep = Maintenance(app.backend, retention={"succeeded": 3600.0})
    assert keep.prune_workflows() == 0  # ended just now: kept
    later = datetime.now(UTC) + timedelta(hours=2)
    assert keep.prune_workflows(now=later) == 1
    assert app.list_workflows() == [] and app.plumbing.workflow_nodes(run.id) == []
