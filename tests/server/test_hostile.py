"""What a hostile or careless client sends gets a 4xx that names the field, never
a 5xx: NUL characters, lone surrogates, huge integers, deep JSON, oversize and
malformed bodies. And the server mounted inside a user's own FastAPI app."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx

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
            try:
                return httpx.get(base + "/shop/ping", timeout=1).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None and (_ for _ in ()).throw(
                    AssertionError(log.read_text())
                )

        wait_for(up, what="the mounted app")
        assert httpx.get(base + "/queue/healthz").json() == {"status": "ok"}
        created = httpx.post(base + "/queue/v1/jobs", json={"task": "t", "args": [1]})
        assert created.status_code == 201
        assert httpx.get(base + f"/queue/v1/jobs/{created.json()['id']}").json()["args"] == [1]
        err = httpx.get(base + "/queue/api/task/getTask", params={"taskId": "x"}).json()
        assert err["code"] == 422  # the asyncflow envelope, under the mount too
        assert httpx.get(base + "/queue/openapi.json").status_code == 200
    finally:
        proc.terminate()
        proc.wait(15)
