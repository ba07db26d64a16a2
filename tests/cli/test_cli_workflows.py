"""`conveyor workflows list|show|cancel|retry` against real databases, on runs a
real worker (in process) ran."""

from __future__ import annotations

import json

from conveyor import Conveyor, Permanent
from tests.runtime.helpers import Running

from .conftest import Invoke


def _failed_run(app: Conveyor) -> int:
    @app.task
    def listing():
        return [1, 2, 3]

    @app.task
    def each(x):
        if x == 2:
            raise Permanent("two is bad")
        return x * 10

    @app.task
    def fin(xs):
        return sum(xs)

    wf = app.workflow("cli-run")
    first = wf.add(listing.s())
    m = wf.map(each.s(), over=first)
    wf.add(fin.s(), after=[m])
    run = wf.start()
    with Running(app, concurrency=2, flow_poll_s=0.2):
        assert run.wait(timeout=60) == "failed"
    return run.id


def test_list_show_cancel_and_retry(app: Conveyor, db_url: str, invoke: Invoke) -> None:
    failed = _failed_run(app)
    listed = invoke("workflows", "list", "--json", url=db_url)
    assert listed.exit_code == 0, listed.output
    [row] = json.loads(listed.output)
    assert (row["id"], row["name"], row["state"], row["failures"]) == (
        failed,
        "cli-run",
        "failed",
        2,
    )
    assert "fingerprint" not in row
    table = invoke("workflows", "list", "--state", "failed", url=db_url)
    assert "cli-run" in table.output and "failed" in table.output
    assert (
        "no workflows match" in invoke("workflows", "list", "--state", "running", url=db_url).output
    )

    shown = json.loads(invoke("workflows", "show", str(failed), "--json", url=db_url).output)
    assert [(n["name"], n["state"]) for n in shown["nodes"]] == [
        ("listing", "succeeded"),
        ("each", "failed"),
        ("fin", "cancelled"),
    ]
    assert shown["nodes"][0]["result"] == [1, 2, 3]
    counts = shown["nodes"][1]["item_counts"]
    assert (counts["succeeded"], counts["failed"]) == (2, 1)
    text = invoke("workflows", "show", str(failed), url=db_url).output
    assert "2/3 succeeded" in text and "two is bad" in text and "cli-run" in text

    # a run nobody runs: retry refused while it runs, cancel once, then refused
    waiting = app.workflow("idle")
    waiting.add(app.plumbing.task_for("nobody.runs.this").s())
    idle = waiting.start().id
    refused = invoke("workflows", "retry", str(idle), url=db_url)
    assert refused.exit_code == 1 and "still running" in refused.output
    cancelled = invoke("workflows", "cancel", str(idle), url=db_url)
    assert cancelled.exit_code == 0 and f"workflow {idle}: cancelled" in cancelled.output

    # the failed run: its failed map (its one failed item) and the cancelled node
    retried = invoke("workflows", "retry", str(failed), url=db_url)
    assert retried.exit_code == 0, retried.output
    assert f"workflow {failed}: running 2 node(s) again" in retried.output
    assert app.plumbing.workflow_record(failed).state == "running"
    again = invoke("workflows", "cancel", str(failed), url=db_url)
    assert again.exit_code == 0
    missing = invoke("workflows", "show", "424242", url=db_url)
    assert missing.exit_code == 2 and "no workflow with id 424242" in missing.output
