"""Batches, queues, workers and per-task-type settings over HTTP, on the real
server (which runs the cluster services: batches close, dead workers are rescued)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from conveyor.outcomes import OutcomeKind, RemoteOutcome
from conveyor.records import WorkerInfo

from .conftest import ROOT, wait_for


def test_batch_idempotency_key_names_one_request(api, producer):
    body = {"task": "square", "items": [[1], {"n": 2}], "name": "b2", "priority": 4}
    r = api.post("/v1/batches", json=body, headers={"Idempotency-Key": "batch-2"})
    assert r.status_code == 201, r.text
    bid = r.json()["id"]
    # a retry, by header or by field: the same batch, 200, as GET shows it
    for kw in ({"headers": {"Idempotency-Key": "batch-2"}}, {}):
        sent = body if kw else {**body, "idempotency_key": "batch-2"}
        again = api.post("/v1/batches", json=sent, **kw)
        assert again.status_code == 200, again.text
        assert again.json() == api.get(f"/v1/batches/{bid}").json()
        assert "fingerprint" not in again.json()
    # a different request under the key: 422 naming it, and nothing written
    for change in ({"items": [[9]]}, {"items": [[1], {"n": 3}]}, {"priority": 5}, {"name": "x"}):
        clash = api.post(
            "/v1/batches", json={**body, **change}, headers={"Idempotency-Key": "batch-2"}
        )
        assert clash.status_code == 422, (change, clash.text)
        detail = clash.json()["detail"]
        assert detail.startswith("Idempotency-Key: 'batch-2' was already used by a different")
        assert f"batch {bid}" in detail
    field = api.post("/v1/batches", json={**body, "items": [[9]], "idempotency_key": "batch-2"})
    assert field.status_code == 422 and field.json()["detail"].startswith("idempotency_key: ")
    assert [b["id"] for b in api.get("/v1/batches").json()["batches"]] == [bid]
    assert sum(producer.count_jobs().values()) == 2


def _run_all(producer, worker="w", state_kind=OutcomeKind.COMPLETE, queues=("default",)):
    producer.serving.heartbeat_worker(WorkerInfo(worker, "h", 1, list(queues), 1))
    jobs = producer.serving.claim(worker, list(queues), limit=1000)
    producer.serving.report(
        worker,
        [
            RemoteOutcome(j.id, j.lease_token, state_kind, result=j.args, permanent=True)
            for j in jobs
        ],
    )
    return jobs


def test_batches(api, producer):
    r = api.post(
        "/v1/batches",
        json={
            "task": "square",
            "items": [[1], [2], {"n": 3}],
            "name": "b1",
            "on_complete": "summarise",
        },
        headers={"Idempotency-Key": "batch-1"},
    )
    assert r.status_code == 201, r.text
    batch = r.json()
    assert (batch["total"], batch["state"], batch["progress"]["total"]) == (3, "running", 3)
    bid = batch["id"]
    jobs = api.get(f"/v1/batches/{bid}/jobs").json()
    assert sorted(j["kwargs"].get("n") or j["args"][0] for j in jobs["jobs"]) == [1, 2, 3]
    # first results while it runs: finish one, read it, then the rest after the cursor
    producer.serving.heartbeat_worker(WorkerInfo("w", "h", 1, ["default"], 1))
    [first] = producer.serving.claim("w", ["default"], limit=1, tasks=["square"])
    producer.serving.report(
        "w", [RemoteOutcome(first.id, first.lease_token, OutcomeKind.COMPLETE, result=1)]
    )
    page = api.get(f"/v1/batches/{bid}/results").json()
    assert [j["id"] for j in page["jobs"]] == [first.id] and page["next_cursor"]
    assert api.get(f"/v1/batches/{bid}").json()["state"] == "running"
    rest = _run_all(producer)
    more = api.get(f"/v1/batches/{bid}/results", params={"cursor": page["next_cursor"]}).json()
    assert sorted(j["id"] for j in more["jobs"]) == sorted(j.id for j in rest if j.batch_id == bid)
    # the server's cluster services close the batch and enqueue its callback
    closed = wait_for(
        lambda: (b := api.get(f"/v1/batches/{bid}").json())["state"] != "running" and b,
        what="the batch to close",
    )
    assert closed["state"] == "succeeded" and closed["callback_job_id"]
    listed = api.get("/v1/batches", params={"limit": 10}).json()
    assert [b["id"] for b in listed["batches"]] == [bid]
    # retry-failed and cancel
    r = api.post("/v1/batches", json={"task": "square", "items": [[1], [2]]})
    bid2 = r.json()["id"]
    _run_all(producer, state_kind=OutcomeKind.FAIL)
    wait_for(
        lambda: api.get(f"/v1/batches/{bid2}").json()["state"] == "completed_with_failures",
        what="batch 2 to close",
    )
    retried = api.post(f"/v1/batches/{bid2}/retry-failed").json()
    assert retried["retried"] == 2 and retried["batch"]["state"] == "running"
    cancelled = api.post(f"/v1/batches/{bid2}/cancel").json()
    assert cancelled["cancelled"] == 2
    assert api.get("/v1/batches/424242").status_code == 404
    assert api.get("/v1/batches/424242/results").status_code == 404
    bad = api.post("/v1/batches", json={"task": "square", "items": []})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "items"]
    # one oversize item among many (written while they are encoded): a 422, and
    # neither the batch nor any of its jobs is kept
    before = (len(api.get("/v1/batches").json()["batches"]), producer.count_jobs(tasks="square"))
    items = [[i] for i in range(600)] + [["x" * (1 << 20)]] + [[i] for i in range(10)]
    huge = api.post("/v1/batches", json={"task": "square", "items": items})
    assert huge.status_code == 422 and "item 600: arguments of task" in huge.text, huge.text
    after = (len(api.get("/v1/batches").json()["batches"]), producer.count_jobs(tasks="square"))
    assert after == before


def test_queues(api, producer):
    producer.enqueue("t", queue="mail")
    producer.enqueue("t", queue="mail")
    queues = {q["name"]: q for q in api.get("/v1/queues").json()["queues"]}
    assert queues["mail"]["counts"] == {"available": 2} and queues["mail"]["paused"] is False
    assert api.post("/v1/queues/mail/pause").json()["paused"] is True
    producer.serving.heartbeat_worker(WorkerInfo("w", "h", 1, ["mail"], 1))
    assert producer.serving.claim("w", ["mail"], limit=5) == []
    assert api.post("/v1/queues/mail/resume").json()["paused"] is False
    unknown = api.post("/v1/queues/nowhere/pause")
    assert unknown.status_code == 422 and "force" in unknown.json()["detail"]
    assert api.post("/v1/queues/nowhere/pause", json={"force": True}).json()["paused"] is True
    limited = api.put("/v1/queues/mail/concurrency", json={"max_running": 1})
    assert limited.json()["max_running"] == 1
    rated = api.put("/v1/queues/mail/rate-limit", json={"rate_limit": "60/m", "burst": 2})
    assert rated.json()["rate_per_s"] == 1.0 and rated.json()["rate_burst"] == 2.0
    assert api.put("/v1/queues/mail/rate-limit", json={"rate_limit": "fast"}).status_code == 422
    assert api.put("/v1/queues/mail/concurrency", json={"max_running": -1}).status_code == 422
    assert (
        api.put("/v1/queues/mail/concurrency", json={"max_running": None}).json()["max_running"]
        is None
    )


def test_workers(api, producer, db_url, tmp_path):
    beat = api.post(
        "/v1/workers/remote-7/heartbeat", json={"queues": ["default"], "hostname": "far", "pid": 42}
    )
    assert beat.status_code == 200 and beat.json() == {
        "held": [],
        "cancel": [],
        "stop": False,
        "heartbeat_s": 2.0,
    }
    producer.enqueue("remote_only")
    lease = api.post("/v1/leases", json={"worker": "remote-7"}).json()
    [job] = lease["jobs"]
    workers = {w["id"]: w for w in api.get("/v1/workers").json()["workers"]}
    me = workers["remote-7"]
    assert (me["hostname"], me["pid"], me["queues"], me["running"], me["alive"]) == (
        "far",
        42,
        ["default"],
        1,
        True,
    )
    assert me["heartbeat_age_s"] >= 0
    assert api.get("/v1/workers/remote-7").json()["id"] == "remote-7"
    assert api.get("/v1/workers/nobody").status_code == 404
    producer.cancel_job(job["id"])
    beat = api.post("/v1/workers/remote-7/heartbeat").json()
    assert (beat["held"], beat["cancel"]) == ([job["id"]], [job["id"]])
    stopped = api.post("/v1/workers/remote-7/stop")
    assert stopped.status_code == 200 and stopped.json()["stop_requested"] is True
    assert api.post("/v1/workers/remote-7/heartbeat").json()["stop"] is True
    assert api.post("/v1/leases", json={"worker": "remote-7"}).json() == {
        "worker": "remote-7",
        "jobs": [],
        "stop": True,
        "heartbeat_s": 2.0,
        "batch_size": 10,
        "poll_interval_s": 1.0,
    }
    assert api.post("/v1/workers/nobody/stop").status_code == 404


def test_workers_are_listed_a_keyset_page_at_a_time(api, producer):
    for wid in ("zz-c", "zz-a|1", "zz-b"):  # any text is an id, "|" too
        assert api.post(f"/v1/workers/{quote(wid)}/heartbeat").status_code == 200
    gone = WorkerInfo(id="zz-dead", hostname="h", pid=1, queues=["default"], concurrency=1)
    producer.backend.worker_heartbeat(worker=gone, now=datetime.now(UTC) - timedelta(minutes=1))
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        body = api.get("/v1/workers", params=params).json()
        assert len(body["workers"]) <= 2
        seen += [w["id"] for w in body["workers"]]
        cursor, pages = body["next_cursor"], pages + 1
        if cursor is None:
            break
    ours = [w for w in seen if w.startswith("zz-")]
    assert ours == ["zz-a|1", "zz-b", "zz-c", "zz-dead"] and len(set(seen)) == len(seen)
    assert pages >= 3  # the server's own internal worker is listed too
    silent = api.get("/v1/workers", params={"alive": "false"}).json()
    assert [w["id"] for w in silent["workers"]] == ["zz-dead"] and not silent["workers"][0]["alive"]
    alive = api.get("/v1/workers", params={"alive": "true"}).json()["workers"]
    assert "zz-dead" not in {w["id"] for w in alive} and all(w["alive"] for w in alive)
    everyone = api.get("/v1/workers").json()
    assert everyone["next_cursor"] is None and len(everyone["workers"]) == len(seen)
    for bad in ({"cursor": "!!"}, {"limit": 0}, {"limit": 1001}, {"alive": "maybe"}):
        r = api.get("/v1/workers", params=bad)
        assert r.status_code == 422 and next(iter(bad)) in r.text, (bad, r.text)


def test_task_settings_over_http_and_cli(api, producer, db_url):
    waiting = producer.enqueue("lark")
    own = producer.enqueue("lark", max_attempts=9)
    r = api.patch(
        "/v1/tasks/lark/settings",
        json={
            "batch_size": 2,
            "poll_interval_s": 0.5,
            "max_attempts": 3,
            "max_processing_s": 30,
            "retry_interval_s": 5,
            "retry_cap_s": 30,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["max_attempts"] == 3 and r.json()["updated_at"]
    # applied at once to the waiting job not sent with its own values
    assert (
        producer.get_job(waiting.id).max_attempts == 3
        and producer.get_job(waiting.id).timeout == 30
    )
    assert producer.get_job(own.id).max_attempts == 9
    # remote workers are told the batch size and poll interval
    for _ in range(3):
        producer.enqueue("lark")
    lease = api.post("/v1/leases", json={"worker": "w", "tasks": ["lark"]}).json()
    assert len(lease["jobs"]) == 2 and (lease["batch_size"], lease["poll_interval_s"]) == (2, 0.5)
    assert lease["jobs"][0]["lease_expires_at"]  # max_processing_s is the lease deadline
    tasks = {t["task"]: t for t in api.get("/v1/tasks").json()["tasks"]}
    assert tasks["lark"]["settings"]["batch_size"] == 2 and tasks["add"]["registered"] is True
    assert api.get("/v1/tasks/lark/settings").json()["retry_cap_s"] == 30.0
    bad = api.patch("/v1/tasks/lark/settings", json={"max_attempts": 0})
    assert bad.status_code == 422 and "max_attempts" in bad.json()["detail"]
    bad = api.patch("/v1/tasks/lark/settings", json={"batch_size": 1.5})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "batch_size"]
    unset = api.patch("/v1/tasks/lark/settings", json={"max_attempts": None}).json()
    assert unset["max_attempts"] is None and unset["batch_size"] == 2
    # the CLI reads and writes the same settings
    cli = [sys.executable, "-m", "conveyor.cli.main", "-d", db_url, "tasks", "settings"]
    out = subprocess.run(
        [*cli, "set", "lark", "--max-attempts", "6", "--unset", "batch_size"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    shown = subprocess.run([*cli, "list", "--json"], cwd=ROOT, capture_output=True, text=True)
    import json

    [row] = json.loads(shown.stdout)
    assert (row["task"], row["max_attempts"], row["batch_size"]) == ("lark", 6, None)
    bad = subprocess.run(
        [*cli, "set", "lark", "--max-attempts", "0"], cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: max_attempts")
    assert api.delete("/v1/tasks/lark/settings").status_code == 204
    assert api.delete("/v1/tasks/lark/settings").status_code == 404
