"""The server's perimeter against browsers and slow clients, on a real ``conveyor
server``: unknown Host names are refused (DNS rebinding), so are writes a browser
marks as coming from another site, every answer carries the security headers, and
a connection that does not send its request head in time is closed. Checked with
the headers browsers send (the browser itself: tests/dashboard/test_perimeter.py).
These do not depend on the database: they run on SQLite only."""

from __future__ import annotations

import select
import socket
import time

import pytest

from .conftest import Server


def _paused(server: Server) -> bool:
    with server.client() as c:
        return any(q["paused"] for q in c.get("/v1/queues").json()["queues"])


def test_unknown_host_names_are_refused(sqlite_server) -> None:
    server = sqlite_server("--allowed-host", ".example.test", "--allowed-host", "q.other.test")
    port = server.port
    with server.client() as api:
        assert api.post("/v1/jobs", json={"task": "t"}).status_code == 201
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io", "x:y"):
            for method, path in [
                ("GET", "/"),
                ("GET", "/v1/jobs"),
                ("POST", "/v1/queues/default/pause"),
                ("POST", "/v1/tokens"),
            ]:
                r = api.request(method, path, headers={"Host": host}, json={"scope": "admin"})
                assert r.status_code == 400, (host, method, path, r.status_code, r.text)
                assert "--allowed-host" in r.json()["detail"]
        for host in (
            f"localhost:{port}",
            f"127.0.0.1:{port}",
            f"[::1]:{port}",
            "LOCALHOST",
            "example.test",
            "a.b.example.test:443",
            "q.other.test",
        ):
            assert api.get("/v1/jobs", headers={"Host": host}).status_code == 200, host
        for host in ("x.q.other.test", "badexample.test", "example.test.evil"):
            assert api.get("/v1/jobs", headers={"Host": host}).status_code == 400, host
        # load balancers probe by address: the probes answer any name (they need no token)
        r = api.get("/healthz", headers={"Host": "10.1.2.3:8081"})
        assert r.status_code == 200
    assert not _paused(server)
    assert "cvy_" not in server.log.read_text()


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://attacker.example"},
        {"Origin": "null"},  # a sandboxed frame, a data: or file: page
        {"Origin": "http://127.0.0.1:1"},  # another port of the same host
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ],
    ids=["other-site", "null", "other-port", "sec-fetch-cross", "sec-fetch-same-site"],
)
def test_cross_site_writes_are_refused(sqlite_server, headers: dict[str, str]) -> None:
    server = sqlite_server()
    with server.client() as api:
        job = api.post("/v1/jobs", json={"task": "remote_only"}).json()["id"]
        done = api.post("/v1/jobs", json={"task": "remote_only"}).json()["id"]
        assert api.post(f"/v1/jobs/{done}/cancel").status_code == 200
        made = api.post("/v1/batches", json={"task": "remote_only", "items": [[1], [2]]})
        batch = made.json()["id"]

        def state() -> object:
            return (
                api.get(f"/v1/jobs/{job}").json()["state"],
                api.get(f"/v1/jobs/{done}").json()["state"],
                api.get(f"/v1/batches/{batch}").json()["state"],
                len(api.get("/v1/jobs").json()["jobs"]),
                _paused(server),
            )

        before = state()
        # what a form can send with no script and no CORS: no body, or a urlencoded one
        form = {"Content-Type": "application/x-www-form-urlencoded", **headers}
        writes = [
            "/v1/queues/default/pause",
            f"/v1/jobs/{job}/cancel",
            f"/v1/jobs/{done}/retry",
            f"/v1/batches/{batch}/cancel",
            "/v1/workers/w1/stop",
            "/api/task/hold_task?taskType=remote_only&status=1",
            "/login",
            "/logout",
        ]
        for path in writes:
            body = b"token=x&next=/" if path == "/login" else b""
            r = api.post(path, content=body, headers=form)
            assert r.status_code == 403, (path, r.status_code, r.text)
            assert "another site" in r.json()["detail"]
        assert api.request("DELETE", f"/v1/jobs/{job}", headers=headers).status_code == 403
        assert api.post("/v1/jobs", json={"task": "t"}, headers=headers).status_code == 403
        # reads stay open to any page's navigation (a browser keeps their answers
        # from another site's script anyway)
        assert api.get("/v1/jobs", headers=headers).status_code == 200
        assert state() == before
        assert before[-1] is False


def test_same_origin_and_non_browser_writes_still_work(sqlite_server) -> None:
    server = sqlite_server()
    own = f"http://127.0.0.1:{server.port}"
    with server.client() as api:
        assert api.post("/v1/jobs", json={"task": "t"}).status_code == 201  # curl, SDKs
        same = {"Origin": own, "Sec-Fetch-Site": "same-origin"}
        assert api.post("/v1/jobs", json={"task": "t"}, headers=same).status_code == 201
        # the browser's own verdict decides: some same-origin posts carry "Origin: null"
        null = {"Origin": "null", "Sec-Fetch-Site": "same-origin"}
        assert api.post("/v1/jobs", json={"task": "t"}, headers=null).status_code == 201
        # TLS ended by a proxy in front: the page is https, the server sees http
        proxied = {"Origin": f"https://127.0.0.1:{server.port}"}
        assert api.post("/v1/jobs", json={"task": "t"}, headers=proxied).status_code == 201
        typed = {"Sec-Fetch-Site": "none"}  # the user's own action (a bookmark, the URL bar)
        assert api.post("/v1/queues/default/pause", headers=typed).status_code == 200


def test_a_proxys_public_name_is_an_own_origin_only_when_given(sqlite_server) -> None:
    # a proxy on this machine that sets Host to the backend's address: the page's
    # Origin is the public name, which the server knows only from --allowed-host
    server = sqlite_server("--allowed-host", "queue.example.test")
    with server.client() as api:
        ok = {"Origin": "https://queue.example.test"}
        assert api.post("/v1/jobs", json={"task": "t"}, headers=ok).status_code == 201
        sub = {"Origin": "https://evil.queue.example.test"}
        assert api.post("/v1/jobs", json={"task": "t"}, headers=sub).status_code == 403


def test_every_answer_carries_the_security_headers(sqlite_server) -> None:
    server = sqlite_server()
    with server.client() as api:
        for path in ("/", "/jobs", "/login", "/static/app.js", "/v1/jobs", "/nope", "/healthz"):
            r = api.get(path)
            assert r.headers["x-frame-options"] == "DENY", path
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert r.headers["referrer-policy"] == "same-origin", path
            csp = r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, path
            assert "unsafe-inline" not in csp, path
        # FastAPI's interactive docs load from a CDN: only framing is forbidden there
        docs = api.get("/docs")
        assert docs.headers["content-security-policy"] == "frame-ancestors 'none'"
        refused = api.get("/", headers={"Host": "attacker.example"})
        assert refused.headers["x-frame-options"] == "DENY"


def test_what_the_client_sent_is_escaped_on_the_dashboards_error_pages(sqlite_server) -> None:
    # uvicorn takes the client's address from X-Forwarded-For when the peer is
    # 127.0.0.1: on an open server the 401 page names that "address"
    server = sqlite_server()
    attack = "<img src=x onerror=alert(1)>"
    with server.client() as api:
        r = api.get("/", headers={"X-Forwarded-For": attack})
        assert r.status_code == 401 and r.headers["content-type"].startswith("text/html")
        assert "<img" not in r.text and "&lt;img src=x onerror=alert(1)&gt;" in r.text
        r = api.get("/workflows", params={"state": attack})
        assert r.status_code == 422 and "<img" not in r.text and "&lt;img" in r.text


def test_the_login_page_says_only_its_own_words(sqlite_server) -> None:
    # ?error= is a code: a link cannot make the sign-in page say what it likes
    server = sqlite_server()
    with server.client() as api:
        planted = "Your session expired: call +1 555 0100 to restore access"
        page = api.get("/login", params={"error": planted})
        assert page.status_code == 200 and "555" not in page.text and "expired" not in page.text
        refused = api.post("/login", content="token=cvy_nope&next=/jobs")
        assert refused.status_code == 303
        assert "error=token" in refused.headers["location"]
        page = api.get(refused.headers["location"])
        assert "That token is not valid." in page.text


def test_the_error_pages_fit_a_phone_in_the_dashboards_style_and_lead_back(sqlite_server) -> None:
    server = sqlite_server()
    with server.client() as api:
        for path, says in [("/jobs/123456789", "no job with id 123456789"), ("/nope", "no page")]:
            missing = api.get(path)
            assert missing.status_code == 404 and says in missing.text
            page = missing.text
            assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
            assert '<link rel="stylesheet" href="/static/app.css">' in page
            assert '<a href="/">Back to the overview</a>' in page
        assert api.get("/static/app.css").status_code == 200  # served to anyone


def test_an_unknown_page_is_the_dashboards_404_and_the_apis_stay_json(sqlite_server) -> None:
    server = sqlite_server()
    with server.client() as api:
        for method, path, says in [
            ("GET", "/dashboard/nope", "no page at /dashboard/nope"),
            ("GET", "/jobs/1/nope", "no page at /jobs/1/nope"),
            ("POST", "/nope", "no page at /nope"),
            ("GET", "/static/nope.css", "no dashboard asset &#x27;nope.css&#x27;"),
            ("GET", "/%3Cscript%3E", "no page at /&lt;script&gt;"),  # escaped, as every page
        ]:
            r = api.request(method, path)
            assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
            assert says in r.text and "<title>404 · Conveyor</title>" in r.text, (path, r.text)
            assert (
                '<meta name="viewport"' in r.text
                and "frame-ancestors 'none'" in (r.headers["content-security-policy"])
            )
        # the REST API's 404s stay JSON, unknown paths and methods included; asyncflow's
        # stay its envelope
        for method, path, detail in [
            ("GET", "/v1/nope", "Not Found"),
            ("POST", "/v1/nope", "Not Found"),
            ("GET", "/v1", "Not Found"),
            ("GET", "/v1/jobs/123456789", "no job with id 123456789"),
            ("POST", "/v1/workers/nobody/stop", "no worker"),
        ]:
            r = api.request(method, path)
            assert r.status_code == 404 and r.headers["content-type"] == "application/json"
            assert detail in r.json()["detail"], (path, r.text)
        assert api.get("/api/nope").json() == {"code": 404, "msg": "Not Found", "result": None}


def _slow_sockets(port: int, n: int) -> tuple[list[socket.socket], list[socket.socket]]:
    """``n`` connections: half send nothing, half start a request and never finish it."""
    silent, trickling = [], []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 2:
            s.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            trickling.append(s)
        else:
            silent.append(s)
        s.setblocking(False)
    return silent, trickling


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True  # reset


def test_slow_request_heads_are_cut_off_while_others_are_served(sqlite_server) -> None:
    server = sqlite_server("--header-timeout", "1")
    silent, trickling = _slow_sockets(server.port, 60)
    socks = silent + trickling
    open_ = list(socks)
    try:
        deadline = time.monotonic() + 30
        while open_ and time.monotonic() < deadline:
            # a real request, served while the slow ones hang on
            with server.client() as api:
                assert api.get("/v1/jobs").status_code == 200
            for s in trickling:
                if s in open_:
                    try:
                        s.send(b"X")  # one more byte of a header that never ends
                    except OSError:
                        pass
            select.select([], [], [], 0.3)
            open_ = [s for s in open_ if not _closed(s)]
        assert open_ == [], (
            f"{len([s for s in open_ if s in silent])} silent and "
            f"{len([s for s in open_ if s in trickling])} trickling connections of "
            f"{len(socks)} still open after 30 s"
        )
    finally:
        for s in socks:
            s.close()
    # a keep-alive client that pauses between requests (under the timeout) is not cut off
    with server.client() as api:
        for _ in range(3):
            assert api.get("/v1/jobs").status_code == 200
            time.sleep(0.6)


def test_a_refused_request_head_is_answered_not_reset(sqlite_server) -> None:
    # uvicorn closed at once with the rest of an oversized head unread: the kernel
    # reset the connection and the client never read the 400 it was sent
    server = sqlite_server()
    with server.client() as api:
        for size in (200_000, 4_000_000):
            r = api.get("/healthz", headers={"X-Big": "a" * size})
            assert r.status_code == 431 and r.text == "Request Header Fields Too Large"
        assert api.get("/healthz", headers={"X-Big": "a" * 12_000}).status_code == 200
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n" + b"x" * 1_000_000)
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 ") and b"Invalid HTTP request" in answer
    with server.client() as api:
        assert api.get("/healthz").status_code == 200
