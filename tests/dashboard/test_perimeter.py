"""The server's perimeter in a real browser (Chromium): a page on another origin,
served by a second HTTP server, cannot pause a queue or sign the browser in with
a plain form; a name pointed at the server's address (DNS rebinding) gets
nothing; the dashboard cannot be framed; and its pages work under its
Content-Security-Policy. The database plays no part: SQLite only."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from conveyor import Conveyor
from tests.server.conftest import Server, sqlite_server, wait_for  # noqa: F401  (a fixture)
from tests.server.test_perimeter import _paused

from .conftest import CHROMIUM


@pytest.fixture
def other_site() -> Iterator[Callable[[str], int]]:
    """``serve(html)``: a second HTTP server, on another port, answering every GET
    with ``html``; returns its port."""
    servers: list[ThreadingHTTPServer] = []

    def serve(html: str) -> int:
        body = html.encode()

        class Page(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Page)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return int(httpd.server_address[1])

    yield serve
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def _form(action: str, fields: dict[str, str]) -> str:
    inputs = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in fields.items())
    return (
        f'<!doctype html><form id="f" method="post" action="{action}">{inputs}</form>'
        '<script>document.getElementById("f").submit()</script>'
    )


@pytest.mark.parametrize("origin_host", ["localhost", "127.0.0.1"], ids=["cross-site", "same-site"])
def test_a_form_on_another_origin_cannot_pause_a_queue(
    sqlite_server,  # noqa: F811
    page,
    other_site,
    origin_host: str,
) -> None:
    # the open server (no token yet: no sign-in needed), as a developer runs it;
    # the page is on another port: of another host name, or of the same one
    server = sqlite_server()
    port = other_site(_form(f"{server.url}/v1/queues/default/pause", {}))
    with page.expect_response(lambda r: r.url.endswith("/pause")) as answer:
        page.goto(f"http://{origin_host}:{port}/")
    assert answer.value.status == 403, answer.value.text()
    assert "another site" in answer.value.json()["detail"]
    assert not _paused(server)


def test_a_form_on_another_site_cannot_sign_the_browser_in(
    sqlite_server,  # noqa: F811
    page,
    other_site,
) -> None:
    # login CSRF: the attacker's own token, posted by the attacker's page, would make
    # the victim act (and type) as the attacker
    server = sqlite_server()
    setup = Conveyor(server.db_url)
    try:
        _, attackers = setup.create_token("admin", name="attacker")
    finally:
        setup.close()
    port = other_site(_form(f"{server.url}/login", {"token": attackers, "next": "/"}))
    with page.expect_response(lambda r: r.url.endswith("/login")) as answer:
        page.goto(f"http://localhost:{port}/")
    assert answer.value.status == 403
    assert page.context.cookies(server.url) == []


@pytest.fixture
def rebinding_page(browser) -> Iterator[object]:
    """A browser that resolves ``attacker.test`` to 127.0.0.1, as a victim's does
    once the attacker's DNS answers so (the rebinding step of the attack)."""
    b = browser.browser_type.launch(
        executable_path=CHROMIUM,
        args=["--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP attacker.test 127.0.0.1"],
    )
    yield b.new_page()
    b.close()


def test_a_rebound_name_gets_nothing(sqlite_server, rebinding_page) -> None:  # noqa: F811
    server = sqlite_server()
    page = rebinding_page
    response = page.goto(f"http://attacker.test:{server.port}/")
    assert response is not None and response.status == 400, response and response.text()
    # the page's script, same-origin as far as the browser knows, tries the API
    results = page.evaluate(
        """async () => {
            const pause = await fetch("/v1/queues/default/pause", {method: "POST"});
            const mint = await fetch("/v1/tokens", {method: "POST",
                headers: {"Content-Type": "application/json"}, body: '{"scope": "admin"}'});
            const jobs = await fetch("/v1/jobs");
            return [pause.status, mint.status, jobs.status];
        }"""
    )
    assert results == [400, 400, 400]
    assert not _paused(server)
    with server.client() as api:
        assert api.get("/v1/jobs").status_code == 200  # still open, to its real names only


def test_the_dashboard_cannot_be_framed(sqlite_server, page, other_site) -> None:  # noqa: F811
    server = sqlite_server()
    port = other_site(f'<!doctype html><iframe src="{server.url}/" width=800 height=600></iframe>')
    with page.expect_response(lambda r: r.url == server.url + "/") as answer:
        page.goto(f"http://localhost:{port}/")
    assert answer.value.status == 200  # served, and then not shown by the browser
    page.wait_for_timeout(500)
    [frame] = [f for f in page.frames if f != page.main_frame]
    assert frame.locator("header .brand").count() == 0  # Chromium shows its error page


def test_batch_bars_are_drawn_under_the_policy(sqlite_server, page) -> None:  # noqa: F811
    server = sqlite_server()
    with server.client() as api:
        made = api.post("/v1/batches", json={"task": "add", "items": [[1, 1], [2, 2]]})
        batch = made.json()["id"]
        [first, _] = api.get("/v1/jobs", params={"batch_id": batch}).json()["jobs"]
        assert api.post(f"/v1/jobs/{first['id']}/cancel").status_code == 200
    wait_for(
        lambda: httpx.get(f"{server.url}/v1/batches/{batch}").json()["progress"]["percent"] > 0,
        what="the batch to progress",
    )
    for path in ("/batches", f"/batches/{batch}"):
        page.goto(server.url + path)
        bar = page.locator(".bar").first
        fill = bar.locator("div").evaluate("d => d.getBoundingClientRect().width")
        whole = bar.evaluate("b => b.getBoundingClientRect().width")
        assert 0.4 < fill / whole < 0.6, (path, fill, whole)
    assert page.errors == []  # no "Refused to apply inline style" either
