"""What a hostile or careless client sends gets a 4xx that names the field, never
a 5xx: NUL characters, lone surrogates, huge integers, deep JSON, oversize and
malformed bodies. And the server mounted inside a user's own FastAPI app."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from urllib.parse import quote

import httpx

from conveyor import Conveyor
from conveyor.server import create_app
from tests.ports import free_port

from .conftest import ROOT, wait_for

JSON = {"Content-Type": "application/json"}


def test_hostile_inputs_get_4xx(api, server):
    cases = [
        ("POST", "/v1/jobs", '{"task": "a\\u0000b"}', "task"),
        ("POST", "/v1/jobs", '{"task": "\\ud800"}', "task"),
        ("POST", "/v1/jobs", '{"task": "t", "args": ["\\ud800x"]}', "surrogate"),
        ("POST", "/v1/jobs", '{"task": "t", "kwargs": {"k\\u0000": 1}}', "NUL"),
        (
            "POST",
            "/v1/jobs",
            '{"task": "t", "priority": 123456789012345678901234567890}',
            "priority",
        ),
        ("POST", "/v1/jobs", '{"task": "t", "delay": 1e308}', "delay"),
        ("POST", "/v1/jobs", '{"task": "t", "timeout": NaN}', "timeout"),
        ("POST", "/v1/jobs", '{"task": "t", "run_at": "9999-12-31T23:59:59Z"}', "run_at"),
        ("POST", "/v1/jobs", '{"task": "t", "args": ' + "[" * 100_000 + "]" * 100_000 + "}", None),
        ("POST", "/v1/jobs", '{"task": ', None),
        ("POST", "/v1/jobs", '["not", "an", "object"]', None),
        ("POST", "/v1/jobs", '{"task": "' + "x" * 300 + '"}', "task"),
        ("GET", "/v1/jobs?task=%00", None, "task"),
        ("GET", "/v1/jobs?search=%ED%A0%80", None, "any"),  # invalid UTF-8: decoded as U+FFFD
        ("GET", "/v1/jobs?limit=99999999999999999999999", None, "limit"),
        ("GET", "/v1/jobs?batch_id=-1", None, "batch_id"),
        ("GET", "/v1/jobs/99999999999999999999", None, "job_id"),
        ("GET", "/v1/jobs/abc", None, "job_id"),
        ("POST", "/v1/queues/a%00b/pause", "{}", "name"),
        ("PUT", "/v1/queues/q/concurrency", '{"max_running": 99999999999}', "max_running"),
        ("PATCH", "/v1/tasks/t/settings", '{"max_attempts": 99999999999999}', "max_attempts"),
        ("PATCH", "/v1/tasks/t/settings", '{"poll_interval_s": 1e400}', "poll_interval_s"),
        ("POST", "/v1/leases", '{"worker": "w", "limit": 100000}', "limit"),
        ("POST", "/v1/leases/1/complete", '{"worker": "w", "token": "t", "result": NaN}', None),
        ("POST", "/v1/batches", '{"task": "t", "items": [1, 2]}', "items"),
        ("GET", "/v1/jobs?cursor=" + "A" * 150, None, "cursor"),
        ("GET", "/v1/jobs?cursor=" + "OTk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5", None, "cursor"),
        ("GET", "/api/task/getTask?taskId=%00", None, None),
        ("POST", "/api/task/createTask", '{"taskData": {"taskType": "t", "orderTime": -5}}', None),
    ]
    for method, path, body, field in cases:
        r = api.request(method, path, content=body, headers=JSON if body else {})
        if path.startswith("/api/"):
            assert r.status_code == 200 and r.json()["code"] >= 400, (path, r.text)
            continue
        if field == "any":
            assert r.status_code < 500
            continue
        assert 400 <= r.status_code < 500, (method, path, body and body[:80], r.status_code, r.text)
        if field:
            assert field in r.text, (path, r.text)
    r = api.post("/v1/jobs", json={"task": "t"}, headers={"Idempotency-Key": "a\tb"})
    assert r.status_code in (201, 422)
    assert "Traceback" not in server.log.read_text()


def test_control_characters_in_names_and_keys_get_422_naming_the_field(api, server):
    # a newline or an ANSI escape in a name could forge or garble a line where the
    # CLI and the dashboard show it; the bulk routes refuse it as the single ones do
    node = {"name": "n", "task": "t"}
    cases = [
        ("POST", "/v1/jobs", {"task": "a\nb"}, "task"),
        ("POST", "/v1/jobs", {"task": "t", "queue": "q\x1b[2J"}, "queue"),
        ("POST", "/v1/jobs", {"task": "t", "tenant": "a\rb"}, "tenant"),
        ("POST", "/v1/jobs", {"task": "t", "unique_key": "a\x07"}, "unique_key"),
        ("POST", "/v1/jobs/bulk", {"jobs": [{"task": "t"}, {"task": "t\x0b"}]}, "task"),
        ("POST", "/v1/jobs/bulk", {"jobs": [{"task": "t"}, {"task": "t", "queue": "\t"}]}, "queue"),
        ("POST", "/v1/batches", {"task": "t", "items": [[1]], "name": "a\nb"}, "name"),
        ("POST", "/v1/batches", {"task": "t", "items": [[1]], "tenant": "\x1b"}, "tenant"),
        ("POST", "/v1/workflows", {"name": "a\nb", "nodes": [node]}, "name"),
        ("POST", "/v1/workflows", {"name": "w", "nodes": [{**node, "name": "\x85"}]}, "name"),
        ("POST", "/v1/tokens", {"scope": "read", "name": "a\nb"}, "name"),
        ("POST", "/v1/queues/a%0Ab/pause", {}, "name"),
        ("PUT", "/v1/queues/a%1Bb/concurrency", {"max_running": 1}, "name"),
        ("POST", "/v1/jobs/bulk-cancel", {"tenant": "a\nb", "dry_run": True}, "tenant"),
        ("POST", "/v1/leases", {"worker": "w", "queues": ["a\nb"]}, "queues"),
        ("POST", "/v1/workers/w/heartbeat", {"hostname": "h\x1b[1m"}, "hostname"),
        ("POST", "/v1/events", {"key": "paid\n1"}, "key"),
    ]
    for method, path, body, field in cases:
        r = api.request(method, path, json=body)
        assert r.status_code == 422, (method, path, body, r.status_code, r.text[:300])
        assert field in r.text and "printable" in r.text, (path, r.text[:300])
    r = api.get("/v1/jobs", params={"queue": "a\nb"})
    assert r.status_code == 422 and "queue" in r.text
    r = api.post("/api/task/createTask", json={"taskData": {"taskType": "a\nb"}})
    assert r.json()["code"] >= 400 and "taskType" in r.text
    # nothing was stored half: no job, batch, workflow, token or worker "w"
    for path in ("/v1/jobs", "/v1/batches", "/v1/workflows", "/v1/tokens"):
        listed = api.get(path).json()
        assert not any(listed.values() if isinstance(listed, dict) else listed), (path, listed)
    assert api.get("/v1/workers/w").status_code == 404
    assert "Traceback" not in server.log.read_text()


def test_keys_longer_than_every_database_stores_get_422_naming_the_field(api, server):
    # MariaDB holds tenants in 255 characters and unique or idempotency keys in 512,
    # and its inserts that skip conflicts cut a longer value short: refused instead
    cases = [
        ({"task": "t", "tenant": "t" * 256}, "tenant"),
        ({"task": "t", "unique_key": "u" * 513}, "unique_key"),
        ({"task": "t", "idempotency_key": "i" * 513}, "idempotency_key"),
    ]
    for body, field in cases:
        r = api.post("/v1/jobs", json=body)
        assert r.status_code == 422 and field in r.text, (body, r.status_code, r.text[:300])
    r = api.post("/v1/jobs", json={"task": "t"}, headers={"Idempotency-Key": "i" * 513})
    assert r.status_code == 422 and "Idempotency-Key" in r.text, r.text[:300]
    r = api.post("/api/task/createTask", json={"taskData": {"taskType": "t", "userId": "u" * 256}})
    assert r.json()["code"] >= 400 and "userId" in r.text
    assert api.get("/v1/jobs").json()["jobs"] == []
    whole = api.post("/v1/jobs", json={"task": "t", "tenant": "t" * 255, "unique_key": "u" * 512})
    assert whole.status_code == 201, whole.text
    got = api.get(f"/v1/jobs/{whole.json()['id']}").json()
    assert (len(got["tenant"]), len(got["unique_key"])) == (255, 512)


def test_bad_query_parameters_get_422_naming_them_on_the_api_and_the_dashboard(api, server):
    huge = "99999999999999999999999"
    cases = [
        ("/v1/jobs?search=a%00b", "search"),
        ("/v1/jobs?queue=a%00b", "queue"),
        ("/v1/jobs?created_after=0001-01-01", "created_after"),
        ("/v1/jobs?created_before=0001-01-01T00:00:00", "created_before"),
        ("/v1/jobs?finished_after=9999-12-31T23:59:59", "finished_after"),
        ("/v1/jobs?batch_id=" + huge, "batch_id"),
        ("/v1/actions/a%00", "action_id"),
        ("/jobs?search=a%00b", "search"),
        ("/jobs?queue=a%00b", "queue"),
        ("/jobs?task=%00", "task"),
        ("/jobs?tenant=%00", "tenant"),
        ("/jobs?stage=%00", "stage"),
        ("/jobs?state=nope", "state"),
        ("/jobs?before=" + huge, "before"),
        ("/jobs?before=0", "before"),
        ("/jobs?batch_id=" + huge, "batch_id"),
        ("/jobs?created_after=0001-01-01", "created_after"),
        ("/jobs?created_before=9999-12-31T23:59:59", "created_before"),
    ]
    for path, name in cases:
        r = api.get(path)
        assert r.status_code == 422, (path, r.status_code, r.text[:300])
        assert name in r.text, (path, r.text[:300])
    r = api.post("/v1/jobs/bulk-cancel", json={"search": "a\u0000b", "dry_run": True})
    assert r.status_code == 422 and "search" in r.text, r.text
    assert api.get("/jobs?state=failed&before=5&created_after=2024-01-01").status_code == 200
    assert "Traceback" not in server.log.read_text()


def test_every_parameter_of_every_route_refuses_what_no_database_holds(api, server):
    """From the OpenAPI document: each query and path parameter in turn gets NUL in a
    string, an integer past 2^63-1, a time no database holds (or without offset)."""
    hostile = {
        "string": ["a\x00b", "\x00"],
        "integer": ["99999999999999999999999", "-99999999999999999999999"],
        "date-time": ["0001-01-01", "0001-01-01T00:00:00", "9999-12-31T23:59:59"],
    }
    tried = 0
    for path, methods in api.get("/openapi.json").json()["paths"].items():
        for method, op in methods.items():
            if path.endswith("/events"):
                continue  # a stream that opens never ends; its filters are the list's
            for param in op.get("parameters", []):
                if param["in"] not in ("query", "path"):
                    continue
                schema = param["schema"]
                kinds = [schema, *schema.get("anyOf", [])]
                kind = next(
                    (k.get("format") or k.get("type") for k in kinds if k.get("format")),
                    next((k.get("type") for k in kinds if k.get("type") in hostile), None),
                )
                if kind == "array":
                    kind = schema.get("items", {}).get("type")
                for value in hostile.get(kind or "", []):
                    url = re.sub(r"\{[^}]+\}", "1", path)
                    if param["in"] == "path":
                        url = path.replace("{" + param["name"] + "}", quote(value, safe=""))
                        url = re.sub(r"\{[^}]+\}", "1", url)
                    query = {param["name"]: value} if param["in"] == "query" else {}
                    r = api.request(
                        method.upper(), url, params=query, json={} if method != "get" else None
                    )
                    assert r.status_code < 500, (method, path, param["name"], value, r.text[:300])
                    tried += 1
    assert tried > 100, tried
    assert "Traceback" not in server.log.read_text()


def test_oversize_bodies_get_413(start_server):
    server = start_server("--max-body-bytes", "2048")
    with server.client() as api:
        big = {"task": "t", "args": ["x" * 5000]}
        assert api.post("/v1/jobs", json=big).status_code == 413
        # no Content-Length (chunked): counted as it streams
        chunks = (b'{"task": "t", "args": ["' + b"x" * 1000 + b'"' for _ in range(5))
        r = api.post("/v1/jobs", content=chunks, headers=JSON)
        assert r.status_code == 413, r.text
        assert api.post("/v1/jobs", json={"task": "t"}).status_code == 201


def test_mounted_inside_a_users_fastapi_app(db_url, tmp_path):
    port = free_port()
    env = {**os.environ, "CONVEYOR_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "mounted.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tests.server.mountapp:parent", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def up():
            # both apps answer (the mount's healthz does not open the database)
            try:
                return all(
                    httpx.get(base + path, timeout=1).status_code == 200
                    for path in ("/shop/ping", "/queue/healthz")
                )
            except httpx.HTTPError:
                return proc.poll() is not None and (_ for _ in ()).throw(
                    AssertionError(log.read_text())
                )

        wait_for(up, what="the mounted app")
        assert httpx.get(base + "/queue/healthz").json() == {"status": "ok"}
        # The first request that opens the database migrates it (auto_migrate): all
        # of MySQL's migrations, over httpx's 5 s twice on a loaded CI machine.
        assert httpx.get(base + "/queue/v1/queues", timeout=120).status_code == 200
        created = httpx.post(base + "/queue/v1/jobs", json={"task": "t", "args": [1]})
        assert created.status_code == 201
        assert httpx.get(base + f"/queue/v1/jobs/{created.json()['id']}").json()["args"] == [1]
        err = httpx.get(base + "/queue/api/task/getTask", params={"taskId": "x"}).json()
        assert err["code"] == 422  # the asyncflow envelope, under the mount too
        assert httpx.get(base + "/queue/openapi.json").status_code == 200
        # an unknown page under the mount is the dashboard's; the API's and the parent's keep theirs
        page = httpx.get(base + "/queue/nope")
        assert page.status_code == 404 and "no page at /nope" in page.text
        assert 'href="/queue/static/app.css"' in page.text and 'href="/queue/"' in page.text
        assert httpx.get(base + "/queue/v1/nope").json() == {"detail": "Not Found"}
        assert httpx.get(base + "/shop/nope").json() == {"detail": "Not Found"}
        # the perimeter holds under the mount, and only there
        rebound = {"Host": "attacker.example"}
        assert httpx.get(base + "/queue/v1/jobs", headers=rebound).status_code == 400
        assert httpx.get(base + "/queue/healthz", headers=rebound).status_code == 200
        assert httpx.get(base + "/shop/ping", headers=rebound).status_code == 200
        foreign = {"Origin": "http://attacker.example"}
        assert (
            httpx.post(base + "/queue/v1/jobs", json={"task": "t"}, headers=foreign).status_code
            == 403
        )
    finally:
        proc.terminate()
        proc.wait(15)


def test_under_starlettes_testclient(tmp_path):
    # TestClient's client is "testclient" at Host "testserver": neither is loopback,
    # so an open server refuses it, and says why and what to do
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # newer Starlette warns that it prefers httpx2
        from starlette.testclient import TestClient
    app = Conveyor(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        with TestClient(create_app(app, allowed_hosts=["testserver"])) as client:
            r = client.get("/v1/jobs")
            assert r.status_code == 401
            assert (
                "TestClient" in r.json()["detail"] and "tokens_required=False" in r.json()["detail"]
            )
        with TestClient(create_app(app)) as client:
            assert client.get("/v1/jobs").status_code == 400  # the Host
        # the way the docstring gives
        for_tests = create_app(app, tokens_required=False, allowed_hosts=["testserver"])
        with TestClient(for_tests) as client:
            assert client.post("/v1/jobs", json={"task": "t"}).status_code == 201
        assert "TestClient" in (create_app.__doc__ or "")
        # or with a token
        _, token = app.create_token("producer")
        with TestClient(create_app(app, allowed_hosts=["testserver"])) as client:
            headers = {"Authorization": f"Bearer {token}"}
            assert client.post("/v1/jobs", json={"task": "t"}, headers=headers).status_code == 201
    finally:
        app.close()
