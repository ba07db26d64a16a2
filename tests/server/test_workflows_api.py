"""``/v1/workflows`` against the real server on every backend, run by a real worker
process: create (with its idempotency key), read, the node events, a failure,
cancel and retry; and bad input gets a 422 naming the field."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tests.server.sse import events

from .conftest import APP, ROOT, wait_for

INGEST = {
    "name": "ingest",
    "nodes": [
        {"name": "pages", "task": "pages", "args": [4]},
        {"name": "double", "task": "double", "map_over": "pages"},
        {"name": "sum", "task": "total", "after": ["pages", "double"]},
    ],
}


@contextmanager
def worker(db_url: str) -> Iterator[subprocess.Popen[bytes]]:
    """A real worker process (``conveyor worker``) running the server's app."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "conveyor.cli.main", "-d", db_url, "worker"),
            *("--app", APP, "--log-level", "warning", "--concurrency", "4"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(60)


def _ended(api, workflow_id: int) -> dict:
    def look() -> dict | None:
        run = api.get(f"/v1/workflows/{workflow_id}").json()
        return run if run["state"] != "running" else None

    return wait_for(look, what=f"workflow {workflow_id} to end")


def test_a_workflow_created_over_http_runs_and_reads_back(api, db_url):
    created = api.post("/v1/workflows", json=INGEST, headers={"Idempotency-Key": "req-9"})
    assert created.status_code == 201, created.text
    run = created.json()
    wid = run["id"]
    assert (run["name"], run["state"], run["total"], run["idempotency_key"]) == (
        "ingest",
        "running",
        3,
        "req-9",
    )
    assert "fingerprint" not in run
    assert [(n["name"], n["kind"], n["parents"]) for n in run["nodes"]] == [
        ("pages", "task", []),
        ("double", "map", [0]),
        ("sum", "task", [0, 1]),
    ]
    assert run["nodes"][0]["state"] == "running" and run["nodes"][0]["job_id"]
    # the same request under the key: the same run, 200; another one: 422 naming the key
    again = api.post("/v1/workflows", json=INGEST, headers={"Idempotency-Key": "req-9"})
    assert again.status_code == 200 and again.json()["id"] == wid
    other = {**INGEST, "name": "other"}
    clash = api.post("/v1/workflows", json=other, headers={"Idempotency-Key": "req-9"})
    assert clash.status_code == 422 and clash.json()["detail"].startswith("Idempotency-Key: ")
    field = api.post("/v1/workflows", json={**other, "idempotency_key": "req-9"})
    assert field.status_code == 422 and field.json()["detail"].startswith("idempotency_key: ")

    stream = events(api, f"/v1/workflows/{wid}/events")
    first = [next(stream) for _ in range(4)]  # every node, then the run, as they stand
    assert [e["event"] for e in first] == ["node", "node", "node", "workflow"]
    assert first[1]["data"]["state"] == "pending" and first[3]["data"]["state"] == "running"
    with worker(db_url):
        rest = list(stream)  # ends once the run has ended
    assert rest[-1]["event"] == "workflow" and rest[-1]["data"]["state"] == "succeeded"
    last = {e["data"]["name"]: e["data"] for e in first + rest if e["event"] == "node"}
    assert {name: n["state"] for name, n in last.items()} == dict.fromkeys(
        ("pages", "double", "sum"), "succeeded"
    )
    assert last["double"]["item_counts"]["succeeded"] == 4

    done = api.get(f"/v1/workflows/{wid}").json()
    assert done["state"] == "succeeded" and done["finished_at"]
    results = {n["name"]: n["result"] for n in done["nodes"]}
    assert results == {"pages": [1, 2, 3, 4], "double": [2, 4, 6, 8], "sum": 30}
    assert done["nodes"][1]["items"] == 4 and done["nodes"][1]["item_counts"]["succeeded"] == 4
    items = api.get(f"/v1/workflows/{wid}/nodes/1/items").json()
    assert [(i["item"], i["result"], i["state"]) for i in items["items"]] == [
        (n, 2 * (n + 1), "succeeded") for n in range(4)
    ]
    assert items["node"]["name"] == "double"
    listed = api.get("/v1/workflows", params={"state": "succeeded"}).json()
    assert [w["id"] for w in listed["workflows"]] == [wid] and "nodes" not in listed["workflows"][0]
    assert api.get("/v1/workflows", params={"state": "failed"}).json()["workflows"] == []
    # an ended run: cancel changes nothing, retry has nothing to run
    cancelled = api.post(f"/v1/workflows/{wid}/cancel").json()
    assert cancelled["cancelled"] is False and cancelled["workflow"]["state"] == "succeeded"


def test_a_failed_workflow_is_retried_and_a_running_one_cancelled(api, db_url, tmp_path):
    flag = str(tmp_path / "flag")
    body = {
        "name": "gated",
        "nodes": [
            {"name": "pages", "task": "pages", "args": [3]},
            {"name": "gate", "task": "gate", "args": [flag], "after": ["pages"]},
            {"name": "sum", "task": "total", "after": ["gate"]},
            {"name": "tidy", "task": "echo", "after": ["gate"], "on_parent_failure": "run"},
        ],
    }
    wid = api.post("/v1/workflows", json=body).json()["id"]
    # no worker yet: it runs, so a retry is refused (409), and it can be cancelled
    refused = api.post(f"/v1/workflows/{wid}/retry")
    assert refused.status_code == 409 and "still running" in refused.json()["detail"]
    cancelled = api.post(f"/v1/workflows/{wid}/cancel").json()
    assert cancelled["cancelled"] is True and cancelled["workflow"]["cancelled_at"]
    # its first node's job, cancelled, ends the node when the flow leader (the
    # server's cluster services) next looks
    assert _ended(api, wid)["state"] == "cancelled"
    assert {n["state"] for n in api.get(f"/v1/workflows/{wid}").json()["nodes"]} == {"cancelled"}
    # a retry of the cancelled run: every node again; the gate fails, its dependents follow
    retried = api.post(f"/v1/workflows/{wid}/retry").json()
    assert retried["retried"] == 4 and retried["workflow"]["state"] == "running"
    with worker(db_url):
        failed = _ended(api, wid)
        assert failed["state"] == "failed" and "missing" in failed["error"]
        states = {n["name"]: n["state"] for n in failed["nodes"]}
        assert states == {
            "pages": "succeeded",
            "gate": "failed",
            "sum": "cancelled",
            "tidy": "succeeded",
        }
        marker = next(n for n in failed["nodes"] if n["name"] == "tidy")["result"]
        assert marker["conveyor_parent_failed"]["node"] == "gate"
        assert marker["conveyor_parent_failed"]["state"] == "failed"
        listed = api.get("/v1/workflows", params={"state": "failed"}).json()["workflows"]
        assert [w["id"] for w in listed] == [wid]
        # the flag is there now: the retry runs the failed and cancelled nodes only
        open(flag, "w").close()
        again = api.post(f"/v1/workflows/{wid}/retry").json()
        assert again["retried"] == 2
        done = _ended(api, wid)
    assert done["state"] == "succeeded" and done["round"] >= 2
    results = {n["name"]: n["result"] for n in done["nodes"]}
    assert results["sum"] == 6 and results["gate"] == [1, 2, 3]


def test_bad_workflows_get_422_naming_the_field(sqlite_server):
    server = sqlite_server()
    node = {"name": "a", "task": "pages", "args": [2]}
    cases = [
        ({"name": "w", "nodes": []}, "nodes"),
        ({"name": "", "nodes": [node]}, "name"),
        ({"name": "w", "nodes": [node, {"name": "b", "task": "double", "after": ["x"]}]}, None),
        ({"name": "w", "nodes": [node, {**node}]}, "nodes[1]: name: "),
        ({"name": "w", "nodes": [{"name": "b", "task": "t", "map_over": "a"}]}, "map_over"),
        ({"name": "w", "nodes": [{**node, "on_parent_failure": "maybe"}]}, "on_parent_failure"),
        ({"name": "w", "nodes": [{**node, "args": [1, 2, 3]}]}, "nodes[0]: "),
        ({"name": "w", "nodes": [{**node, "options": {"priority": 2**40}}]}, "priority"),
        ({"name": "w", "nodes": [{**node, "colour": "red"}]}, "colour"),
        ({"name": "w", "nodes": [{**node, "task": "a\u0000"}]}, "task"),
        (
            {
                "name": "w",
                "nodes": [
                    node,
                    {"name": "m", "task": "double", "map_over": "a", "on_parent_failure": "run"},
                ],
            },
            "nodes[1]: on_parent_failure",
        ),
    ]
    with server.client() as api:
        for body, field in cases:
            r = api.post("/v1/workflows", json=body)
            assert r.status_code == 422, (body, r.text)
            if field is None:
                assert r.json()["detail"] == "nodes[1].after: no node 'x' declared before this one"
            else:
                assert field in r.text, (body, r.text)
        assert api.get("/v1/workflows").json()["workflows"] == []  # nothing was written
        wid = api.post("/v1/workflows", json={"name": "w", "nodes": [node]}).json()["id"]
        assert api.get(f"/v1/workflows/{wid}/nodes/5/items").status_code == 422
        assert "node" in api.get(f"/v1/workflows/{wid}/nodes/5/items").text
        assert api.get("/v1/workflows/424242").status_code == 404
        assert api.post("/v1/workflows/424242/cancel").status_code == 404
        assert api.post("/v1/workflows/424242/retry").status_code == 404
        assert api.get("/v1/workflows/424242/events").status_code == 404
        assert api.get("/v1/workflows", params={"state": "nope"}).status_code == 422
        assert "before_id" in api.get("/v1/workflows", params={"before_id": 0}).text
    assert "Traceback" not in server.log.read_text()


def test_the_guide_s_request_starts_a_run(sqlite_server):
    """docs/guides/workflows.md's curl example, its body and key as written."""
    guide = (ROOT / "docs" / "guides" / "workflows.md").read_text()
    block = guide.split("<!-- checked-by: tests/server/test_workflows_api.py -->")[1]
    key = re.search(r"Idempotency-Key: ([\w-]+)", block)
    body = re.search(r"-d '(\{.*?\})'", block, re.S)
    assert key and body, "the guide's curl example moved"
    server = sqlite_server()
    with server.client() as api:
        headers = {"Idempotency-Key": key[1], "Content-Type": "application/json"}
        created = api.post("/v1/workflows", content=body[1], headers=headers)
        assert created.status_code == 201, created.text
        run = created.json()
        assert [(n["name"], n["kind"], n["state"]) for n in run["nodes"]] == [
            ("fetch", "task", "running"),
            ("parse", "task", "pending"),
            ("resize", "map", "pending"),
            ("store", "task", "pending"),
            ("report", "task", "pending"),
        ]
        again = api.post("/v1/workflows", content=body[1], headers=headers)
        assert again.status_code == 200 and again.json()["id"] == run["id"]
        typo = json.loads(body[1])
        typo["nodes"][2]["map_over"] = "pars"
        bad = api.post("/v1/workflows", json=typo)
        assert bad.json()["detail"] == "nodes[2].map_over: no node 'pars' declared before this one"
