"""A token revoked while its event stream is open stops receiving events: the
stream ends (after a last comment saying why) instead of delivering jobs'
results and errors for good. Revoked on the same server (``DELETE
/v1/tokens/{id}``) nothing more is sent; from another process (the CLI, another
app) within the token cache's ``AUTH_CACHE_S``, as the security page says. The
real server, on every backend; the dashboard's cookie as well as the header."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx

from conveyor.serving import AUTH_CACHE_S

from .conftest import APP, ROOT, wait_for

REVOKED = ": the token this stream was opened with is no longer valid"


class Follower:
    """A client following one event stream in a thread: its events as they come,
    its comment lines, and when (if) the server ended it."""

    def __init__(self, client: httpx.Client, path: str, **params: object) -> None:
        self.events: list[dict] = []
        self.comments: list[str] = []
        self.ended_at: float | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(client, path, params), daemon=True)
        self._thread.start()

    def _run(self, client: httpx.Client, path: str, params: dict) -> None:
        try:
            with client.stream("GET", path, params=params, timeout=60) as r:
                assert r.status_code == 200, r.read().decode()
                event: dict = {}
                for line in r.iter_lines():
                    if line.startswith(":"):
                        self.comments.append(line)
                    elif not line:
                        if "data" in event:
                            self.events.append({**event, "data": json.loads(event["data"])})
                        event = {}
                    else:
                        name, _, value = line.partition(":")
                        event[name] = value.removeprefix(" ")
            self.ended_at = time.monotonic()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def saw(self, kind: str, job_id: int | None = None) -> bool:
        return any(
            e["event"] == kind and (job_id is None or e["data"].get("id") == job_id)
            for e in self.events
        )

    def ended_within(self, seconds: float) -> float:
        """How long after now the stream ended; fails if it did not within ``seconds``."""
        start = time.monotonic()
        self._thread.join(seconds)
        assert self.error is None, self.error
        assert self.ended_at is not None, (
            f"the stream still runs {seconds} s after its token was revoked; "
            f"events: {[e['event'] for e in self.events]}"
        )
        kinds = [e["event"] for e in self.events]
        assert self.comments and self.comments[-1] == REVOKED, (self.comments, kinds)
        return self.ended_at - start


def _lease_and_complete(server, worker_token: str, task: str, n: int) -> None:
    """A remote worker takes ``n`` jobs of ``task`` and completes them, with a result."""
    with server.client(worker_token) as w:
        r = w.post("/v1/leases", json={"worker": "w1", "tasks": [task], "limit": n, "wait_s": 5})
        jobs = r.json()["jobs"]
        assert len(jobs) == n, r.text
        for job in jobs:
            held = {"worker": "w1", "token": job["token"]}
            done = w.post(f"/v1/leases/{job['id']}/complete", json={**held, "result": "secret"})
            assert done.status_code == 200, done.text


def test_a_token_revoked_on_the_server_ends_its_events_stream_at_once(start_server, producer):
    read_tok, read = producer.create_token("read", name="watcher")
    _, worker = producer.create_token("worker", name="worker")
    _, admin = producer.create_token("admin", name="admin")
    server = start_server("--app", APP)
    with server.client(read) as watcher, server.client(admin) as boss:
        stream = Follower(watcher, "/v1/events", task="rev_task")
        sent: list[int] = []

        def live() -> bool:  # the stream starts when it has read where "now" is
            if len(sent) < 1 + int(time.monotonic() - opened):  # one more job a second
                sent.append(producer.enqueue("rev_task").id)
            return any(stream.saw("job.created", i) for i in sent)

        opened = time.monotonic()
        wait_for(live, timeout=20, what="the stream to deliver a first event")

        assert boss.delete(f"/v1/tokens/{read_tok.id}").status_code == 204
        revoked_at = time.monotonic()
        hidden = producer.enqueue("rev_task")
        _lease_and_complete(server, worker, "rev_task", len(sent) + 1)

        stream.ended_within(10)
        assert stream.ended_at is not None and stream.ended_at - revoked_at < 3
        # nothing that happened after the revocation went out: no new job, no result
        assert not stream.saw("job.created", hidden.id)
        assert not stream.saw("job.started") and not stream.saw("job.succeeded")
        # and the token cannot open a stream again
        assert watcher.get("/v1/events").status_code == 401


def test_a_batch_stream_ends_when_another_process_revokes_its_token(start_server, producer, db_url):
    read_tok, read = producer.create_token("read", name="watcher")
    _, worker = producer.create_token("worker", name="worker")
    _, maker = producer.create_token("producer", name="maker")
    server = start_server("--app", APP)
    with server.client(maker) as prod:
        r = prod.post("/v1/batches", json={"task": "rev_item", "items": [[1], [2], [3]]})
        assert r.status_code == 201, r.text
        batch_id = r.json()["id"]
    with server.client(read) as watcher:
        stream = Follower(watcher, f"/v1/batches/{batch_id}/events")
        wait_for(lambda: stream.saw("batch.progress"), timeout=20, what="the batch's progress")

        cli = [sys.executable, "-m", "conveyor.cli.main", "-d", db_url, "tokens"]
        out = subprocess.run(
            [*cli, "revoke", read_tok.id], cwd=ROOT, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        revoked_at = time.monotonic()
        # the documented window: another server's revocation is seen within AUTH_CACHE_S
        time.sleep(AUTH_CACHE_S + 0.2)
        _lease_and_complete(server, worker, "rev_item", 2)  # (the batch stays open)

        stream.ended_within(10)
        assert stream.ended_at is not None and stream.ended_at - revoked_at < AUTH_CACHE_S + 2.5
        assert not stream.saw("job.started") and not stream.saw("job.succeeded")


def test_the_dashboards_cookie_stream_ends_when_its_token_is_revoked(start_server, producer):
    read_tok, read = producer.create_token("read", name="dashboard")
    _, maker = producer.create_token("producer", name="maker")
    server = start_server("--app", APP)
    body = {"name": "held", "nodes": [{"name": "one", "task": "rev_never_run"}]}
    with server.client(maker) as prod:
        r = prod.post("/v1/workflows", json=body)
        assert r.status_code == 201, r.text
        workflow_id = r.json()["id"]
    with server.client() as browser:  # signed in as the dashboard is: a cookie, no header
        login = browser.post("/login", data={"token": read, "next": "/"})
        assert login.status_code == 303 and "conveyor_token" in browser.cookies
        stream = Follower(browser, f"/v1/workflows/{workflow_id}/events")
        wait_for(lambda: stream.saw("workflow"), timeout=20, what="the workflow's first events")

        producer.revoke_token(read_tok.id)  # from another process than the server's
        stream.ended_within(AUTH_CACHE_S + 5)
        assert browser.get(f"/v1/workflows/{workflow_id}/events").status_code == 401
        assert browser.get("/", follow_redirects=False).status_code == 303  # to /login
