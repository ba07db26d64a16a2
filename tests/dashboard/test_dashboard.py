"""The dashboard as a person uses it: every page renders with no script error and
no request leaving the server; a batch's bar moves while a worker runs, with no
reload; actions work with a token that allows them and are neither shown nor
accepted with a read token; sending a job by hand shows a bad argument next to
its field; links carry queue and task names URL-encoded. Why a job waits is read
from the engine (tested on the façade too)."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from urllib.parse import urljoin

import httpx
import pytest

from conveyor import Conveyor
from conveyor.records import WorkerInfo
from tests.server.conftest import ROOT, wait_for

PAGES = [
    "/",
    "/jobs",
    "/jobs?state=available&queue=default",
    "/batches",
    "/workflows",
    "/workers",
    "/tasks",
    "/trigger",
]


def _seed(server) -> dict[str, int]:
    with server.client() as c:
        job = c.post("/v1/jobs", json={"task": "add", "args": [1, 2]}).json()["id"]
        batch = c.post("/v1/batches", json={"task": "add", "items": [[i, 1] for i in range(300)]})
        assert batch.status_code == 201, batch.text
        return {"job": job, "batch": batch.json()["id"]}


def _sign_in(page, base: str, token: str) -> None:
    page.goto(base + "/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


def test_every_page_renders_without_errors_or_outside_requests(server, page, tmp_path) -> None:
    ids = _seed(server)
    page.on(
        "request", lambda r: None if r.url.startswith(server.url) else page.outside.append(r.url)
    )
    paths = [*PAGES, "/actions", f"/jobs/{ids['job']}", f"/batches/{ids['batch']}"]
    paths.append(f"/trigger?again={ids['job']}")
    for width in (1280, 420):  # a desktop window and a narrow one
        page.set_viewport_size({"width": width, "height": 800})
        for path in paths:
            response = page.goto(server.url + path)
            assert response is not None and response.status == 200, path
            page.wait_for_timeout(200)
            assert page.locator("main h1").count() == 1, path
            name = path.strip("/").replace("/", "-").replace("?", "-").replace("&", "-")
            page.screenshot(
                path=str(tmp_path / f"{width}-{name or 'overview'}.png"), full_page=True
            )
    assert page.errors == []
    assert page.outside == []
    # a waiting job says why: nobody serves its queue here
    page.goto(f"{server.url}/jobs/{ids['job']}")
    assert "no live worker takes queue 'default'" in page.locator("#why").inner_text()


def test_a_batch_bar_advances_live_while_a_worker_runs(server, page, db_url) -> None:
    ids = _seed(server)
    page.goto(f"{server.url}/batches/{ids['batch']}")
    assert page.locator(".bar.big span").inner_text() == "0%"
    page.evaluate("window.__same_page = true")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "conveyor.cli.main",
            "-d",
            db_url,
            "worker",
            "--app",
            "tests.server.srvapp:app",
            "--burst",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        page.wait_for_function(
            "() => document.querySelector('#batch-state').textContent.trim() === 'succeeded'",
            timeout=60_000,
        )
    finally:
        worker.wait(60)
    assert page.locator(".bar.big span").inner_text() == "100%"
    assert page.evaluate("window.__same_page") is True  # updated in place, never reloaded
    assert page.errors == []


def test_a_read_token_sees_no_actions_and_cannot_act(server, page, producer) -> None:
    ids = _seed(server)
    _, read = producer.create_token("read", name="viewer")
    _, admin = producer.create_token("admin", name="ops")
    # tokens exist now (the server re-reads that within 2 s): pages need a sign-in
    wait_for(lambda: httpx.get(server.url + "/v1/jobs").status_code == 401, what="auth on")
    page.goto(f"{server.url}/jobs/{ids['job']}")
    assert "/login" in page.url
    _sign_in(page, server.url, read)
    page.goto(f"{server.url}/jobs/{ids['job']}")
    assert page.locator("[data-job-action]").count() == 0
    page.goto(server.url + "/")
    assert page.locator("[data-action=pause]").count() == 0
    status = page.evaluate(
        """async (id) => (await fetch(`/v1/jobs/${id}/cancel`, {method: "POST",
           headers: {"X-Conveyor-Dashboard": "1"}})).status""",
        ids["job"],
    )
    assert status == 403
    page.errors.clear()  # the browser logs that refusal; nothing else may be logged
    assert producer.get_job(ids["job"]).state == "available"

    _sign_in(page, server.url, admin)
    page.goto(f"{server.url}/jobs/{ids['job']}")
    page.click("[data-job-action=cancel]")  # confirm() is accepted by the fixture
    wait_for(lambda: producer.get_job(ids["job"]).state == "cancelled", timeout=15, what="cancel")
    page.goto(server.url + "/")
    page.click("[data-action=pause][data-queue=default]")
    wait_for(
        lambda: any(q.paused for q in producer.queues() if q.name == "default"),
        timeout=15,
        what="pause",
    )
    assert page.errors == []


def test_a_cookie_alone_cannot_change_anything(server, producer) -> None:
    ids = _seed(server)
    _, admin = producer.create_token("admin")
    wait_for(lambda: httpx.get(server.url + "/v1/jobs").status_code == 401, what="auth on")
    with httpx.Client(base_url=server.url, cookies={"conveyor_token": admin}) as c:
        assert c.get(f"/v1/jobs/{ids['job']}").status_code == 200
        refused = c.post(f"/v1/jobs/{ids['job']}/cancel")
        assert refused.status_code == 403
        assert "x-conveyor-dashboard" in refused.json()["detail"]
    assert producer.get_job(ids["job"]).state == "available"


class _Links(HTMLParser):
    """Each link's text and its href as a browser reads it (entities decoded)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self.links.append((data, self._href))
            self._href = None


def _follow(c: httpx.Client, page: str, text: str) -> list[set[int]]:
    """Follow each link on ``page`` whose text is ``text`` (or starts with it, for
    ``text`` ending in a space) as a browser does (the fragment stays in the
    browser): the ids of the jobs listed where each leads."""
    parser = _Links()
    parser.feed(c.get(page).text)
    out = []
    for t, href in parser.links:
        if t == text or (text.endswith(" ") and t.startswith(text)):
            listed = c.get(urljoin(str(c.base_url.join(page)), href).split("#")[0])
            assert listed.status_code == 200, listed.text
            out.append({int(m) for m in re.findall(r'href="/jobs/(\d+)"', listed.text)})
    return out


def test_links_carry_queue_and_task_names_url_encoded(server) -> None:
    odd, task = "a&b#c+d%", "t&state=failed#x"
    with server.client() as c:
        ids = {}
        for queue in (odd, "a"):  # without encoding, the link would open queue "a"
            r = c.post("/v1/jobs", json={"task": task, "queue": queue})
            assert r.status_code == 201, r.text
            ids[queue] = r.json()["id"]
        assert _follow(c, "/", odd) == [{ids[odd]}]  # the queue's row
        assert _follow(c, f"/jobs/{ids[odd]}", odd) == [{ids[odd]}]  # the job's queue
        # waiting with no live worker: each link names its queue and the task
        unserved = _follow(c, "/", "1 \u00d7 ")
        assert sorted(unserved, key=min) == [{ids[odd]}, {ids["a"]}]


def _next_link(c: httpx.Client, path: str) -> tuple[list[str], str | None]:
    """The workers a page lists, and where its "Next" link leads (None: no link)."""
    r = c.get(path)
    assert r.status_code == 200, (path, r.text)
    parser = _Links()
    parser.feed(r.text)
    after = [href for text, href in parser.links if text.startswith("Next")]
    return re.findall(r'data-worker="([^"]*)"', r.text), after[0] if after else None


def test_the_workers_page_shows_a_hundred_and_links_to_the_next(server, producer) -> None:
    ours = [f"zz-{i:03d}" for i in range(250)]
    for wid in ours:
        info = WorkerInfo(id=wid, hostname="h", pid=1, queues=["default"], concurrency=1)
        producer.backend.worker_heartbeat(worker=info)
    # silent a minute: past the worker ttl (7 s), before the server forgets it (300 s)
    gone = WorkerInfo(id="zz-gone", hostname="h", pid=1, queues=["default"], concurrency=1)
    producer.backend.worker_heartbeat(worker=gone, now=datetime.now(UTC) - timedelta(minutes=1))
    with server.client() as c:
        pages, path = [], "/workers"
        while path is not None:
            listed, path = _next_link(c, path)
            pages.append(listed)
        seen = [w for listed in pages for w in listed]
        # the server's own worker is listed too: 252 or so, by id, each once
        assert [len(p) for p in pages[:2]] == [100, 100] and 0 < len(pages[2]) < 100
        assert len(pages) == 3 and seen == sorted(set(seen))
        assert [w for w in seen if w.startswith("zz-")] == [*ours, "zz-gone"]
        # the overview counts them, the silent one links to the silent ones
        overview = c.get("/").text
        assert f"<b>{len(seen) - 1}</b> live workers" in overview
        assert '/workers?alive=false">1 silent</a>' in overview
        assert _next_link(c, "/workers?alive=false") == (["zz-gone"], None)
        alive, after = _next_link(c, "/workers?alive=true")
        assert len(alive) == 100 and "zz-gone" not in alive
        assert after == f"/workers?alive=true&after={alive[-1]}"
        rest = [w for w in seen if w > alive[-1] and w != "zz-gone"]
        assert _next_link(c, after)[0] == rest[:100]
        assert _next_link(c, "/workers?after=zz-zz") == ([], None)  # past the last
        # a hostile cursor or filter: a 422 that names it, never a database error
        for bad, field in [
            ("after=%00", "after"),
            ("after=" + "x" * 300, "after"),
            ("alive=maybe", "alive"),
        ]:
            r = c.get(f"/workers?{bad}")
            assert r.status_code == 422 and f"bad filter: {field}:" in r.text, (bad, r.text)
        # text, not SQL (and not UTF-8 either): a page of the ids after it, all of them
        odd, _ = _next_link(c, "/workers?after=%27%20OR%201%3D1%20--%ED%A0%80%FF%7C")
        assert odd == seen[:100]


def test_sending_by_hand_checks_the_arguments_first(server, page, producer) -> None:
    page.goto(server.url + "/trigger")
    page.fill("input[name=task]", "add")
    page.fill("textarea[name=args]", "[1]")
    page.click("#trigger button[type=submit]")
    error = page.locator('.field-error[data-field="args"]')
    error.wait_for(state="visible")
    page.wait_for_function(
        "() => document.querySelector('.field-error[data-field=args]').textContent.length > 0"
    )
    assert "missing a required argument: 'b'" in error.inner_text()
    assert producer.count_jobs(task="add").get("available", 0) == 0  # nothing stored

    page.fill("textarea[name=args]", "[1, 2]")
    page.fill("input[name=priority]", "7")
    page.click("#trigger button[type=submit]")
    link = page.locator("#trigger-result a")
    link.wait_for()
    job_id = int(link.inner_text().split()[1])
    job = producer.get_job(job_id)
    assert (job.task, job.args, job.priority) == ("add", [1, 2], 7)


def test_why_a_job_waits(app: Conveyor) -> None:
    later = app.enqueue("elsewhere.task", [1], queue="q1", delay=3600)
    app.pause_queue("q1")
    reasons = app.why_waiting(later.id)
    assert any(r.startswith("scheduled for") and "sent to run later" in r for r in reasons)
    assert "queue 'q1' is paused" in reasons
    assert any("no live worker takes queue 'q1'" in r for r in reasons)

    app.resume_queue("q1")
    app.set_queue_limit("q1", 0)
    now = app.enqueue("elsewhere.task", [2], queue="q1", pinned_to="gpu")
    reasons = app.why_waiting(now.id)
    assert not any(r.startswith("scheduled for") for r in reasons)
    assert "queue 'q1' is at its limit: 0 running of 0" in reasons
    assert any(r.startswith("pinned to gpu") for r in reasons)

    app.set_queue_limit("q1", None)
    app.cancel_job(now.id)
    assert app.why_waiting(now.id) == []  # it ended: nothing holds it back
    assert datetime.now(UTC) - timedelta(seconds=5) < app.get_job(now.id).created_at
    with pytest.raises(Exception, match="no job"):
        app.why_waiting(10**9)


def test_a_bulk_action_on_a_filter_runs_in_the_background_and_is_logged(server, page, producer):
    with server.client() as c:
        for i in range(30):
            c.post("/v1/jobs", json={"task": "add", "args": [i, 1]})
        c.post("/v1/jobs", json={"task": "send_email", "args": ["x@y.z"]})
    page.goto(f"{server.url}/jobs?state=available&task=add")
    assert page.locator("table.jobs tbody tr").count() == 30
    page.click("[data-bulk=cancel]")  # a dry-run count, a confirm() (accepted), then the run
    page.locator(".bulk-status").wait_for()
    wait_for(lambda: producer.count_jobs(task="add") == {"cancelled": 30}, timeout=30, what="bulk")
    assert producer.count_jobs(task="send_email") == {"available": 1}  # outside the filter
    page.goto(server.url + "/actions")
    row = page.locator("tbody tr").first
    assert "cancel" in row.inner_text() and "30" in row.inner_text()
    assert page.errors == []


def test_retry_pause_resume_and_bulk_retry_with_a_real_worker(
    server, page, producer, db_url, tmp_path
):
    flag = tmp_path / "fixed"
    with server.client() as c:
        broken = [
            c.post("/v1/jobs", json={"task": "fragile", "args": [str(flag)]}).json()["id"]
            for _ in range(3)
        ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "conveyor.cli.main", "-d", db_url, "worker"]
    cmd += ["--app", "tests.server.srvapp:app", "--log-level", "warning"]
    worker = subprocess.Popen(cmd, cwd=ROOT, env=env)
    try:
        wait_for(
            lambda: producer.count_jobs(task="fragile") == {"failed": 3},
            timeout=60,
            what="the jobs to fail",
        )
        flag.write_text("now it works")
        # retry one from its page: it runs again and succeeds
        page.goto(f"{server.url}/jobs/{broken[0]}")
        page.click("[data-job-action=retry]")
        wait_for(lambda: producer.get_job(broken[0]).state == "succeeded", timeout=30, what="retry")
        page.goto(f"{server.url}/jobs/{broken[0]}")
        assert page.locator("h1 .badge").inner_text() == "succeeded"
        # bulk-retry every failed job of the task
        page.goto(f"{server.url}/jobs?state=failed&task=fragile")
        page.click("[data-bulk=retry]")
        page.wait_for_function(
            "() => (document.querySelector('.bulk-status') || {}).textContent?.includes('done')",
            timeout=30_000,
        )
        wait_for(
            lambda: producer.count_jobs(task="fragile") == {"succeeded": 3},
            timeout=60,
            what="bulk retry",
        )
        # pause: a new job waits, and says why; resume: it runs
        page.goto(server.url + "/")
        page.click("[data-action=pause][data-queue=default]")
        wait_for(
            lambda: any(q.paused for q in producer.queues() if q.name == "default"),
            timeout=15,
            what="pause",
        )
        with server.client() as c:
            held = c.post("/v1/jobs", json={"task": "add", "args": [2, 2]}).json()["id"]
        page.wait_for_timeout(1500)  # a worker is up and polling: it would have taken it
        assert producer.get_job(held).state == "available"
        page.goto(f"{server.url}/jobs/{held}")
        assert "queue 'default' is paused" in page.locator("#why").inner_text()
        page.goto(server.url + "/")
        page.click("[data-action=resume][data-queue=default]")
        wait_for(lambda: producer.get_job(held).state == "succeeded", timeout=30, what="resume")
        assert producer.get_job(held).result == 4
    finally:
        worker.terminate()
        worker.wait(30)
    assert page.errors == []


def test_sensitive_arguments_never_reach_the_page(server, page) -> None:
    with server.client() as c:
        job = c.post("/v1/jobs", json={"task": "sign_up", "args": ["bob", "hunter2"]}).json()["id"]
    for path in (f"/jobs/{job}", "/jobs?task=sign_up", f"/trigger?again={job}"):
        page.goto(server.url + path)
        assert "hunter2" not in page.content(), path
    page.goto(f"{server.url}/jobs/{job}")
    assert "***" in page.locator("pre").first.inner_text()


def _prefilled(c: httpx.Client, job_id: int) -> tuple[list, dict, str]:
    """What "Run again with these arguments" fills in: args, kwargs, and the note."""
    page = c.get("/trigger", params={"again": job_id})
    assert page.status_code == 200, page.text
    assert "hunter2" not in page.text
    assert "***" not in page.text  # sent back, it would run the task with "***"
    fields = {
        name: json.loads(html.unescape(text))
        for name, text in re.findall(r'<textarea name="(\w+)"[^>]*>(.*?)</textarea>', page.text)
    }
    note = re.search(r'<p class="warn" id="sensitive-note">(.*?)</p>', page.text)
    return fields["args"], fields["kwargs"], html.unescape(note.group(1)) if note else ""


def test_run_again_leaves_sensitive_arguments_out_and_names_them(server, producer) -> None:
    with server.client() as c:
        by_position = c.post("/v1/jobs", json={"task": "sign_up", "args": ["bob", "hunter2"]})
        by_name = c.post(
            "/v1/jobs",
            json={"task": "sign_up", "kwargs": {"user": "al", "password": "hunter2"}},
        )
        plain = c.post("/v1/jobs", json={"task": "add", "args": [1, 2]})
        ids = [r.json()["id"] for r in (by_position, by_name, plain)]

        args, kwargs, note = _prefilled(c, ids[0])
        assert (args, kwargs) == (["bob"], {}) and "enter again: password (argument 2)" in note
        args, kwargs, note = _prefilled(c, ids[1])
        assert (args, kwargs) == ([], {"user": "al"}) and "enter again: password." in note
        assert _prefilled(c, ids[2]) == ([1, 2], {}, "")
        # what is filled in, with the password entered again, is a job that runs
        again = c.post(
            "/v1/jobs", json={"task": "sign_up", "args": ["bob"], "kwargs": {"password": "x"}}
        )
        assert again.status_code == 201, again.text
    _, read = producer.create_token("read")
    wait_for(lambda: httpx.get(server.url + "/v1/jobs").status_code == 401, what="auth on")
    with httpx.Client(base_url=server.url, cookies={"conveyor_token": read}) as c:
        assert _prefilled(c, ids[0])[:2] == (["bob"], {})  # a read token recovers nothing


#: where the guide's screenshots go when asked (``CONVEYOR_SCREENSHOTS=docs/images``);
#: a normal run keeps them in the test's temporary folder
SCREENSHOTS = os.environ.get("CONVEYOR_SCREENSHOTS")


def _worker(db_url: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "conveyor.cli.main", "-d", db_url, "worker"),
            *("--app", "tests.server.srvapp:app", "--log-level", "warning", *args),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_a_populated_cluster_reads_right_and_makes_the_guides_screenshots(
    server, page, producer, db_url, tmp_path
) -> None:
    """Successes, failures and a batch caught half-way, as the dashboard guide
    shows them: the failed jobs are listed with their error, the batch's bar
    stands between its ends. The screenshots (1280x800) are the guide's."""
    with server.client() as c:  # through the server: its app gives each task's options
        jobs = [{"task": "add", "args": [i, i]} for i in range(40)]
        jobs += [{"task": "send_email", "args": [f"user{i}@example.com"]} for i in range(12)]
        assert c.post("/v1/jobs/bulk", json={"jobs": jobs}).status_code == 201
        failed = [
            c.post("/v1/jobs", json={"task": "fragile", "args": [f"/nonexistent/flag-{i}"]}).json()[
                "id"
            ]
            for i in range(3)
        ]
    assert _worker(db_url, "--burst").wait(120) == 0
    with server.client() as c:
        created = c.post(
            "/v1/batches",
            json={"task": "add", "items": [[i, 1] for i in range(1200)], "name": "nightly-sums"},
        )
        assert created.status_code == 201, created.text
        batch = created.json()["id"]
    # Catch the batch half-way: pause its queue once a third of it is done, let the
    # running jobs finish, stop the worker, resume (nothing runs it any more)
    worker = _worker(db_url, "--concurrency", "2", "--fetch-batch", "2")
    try:
        wait_for(lambda: producer.batch_progress(batch).get("succeeded", 0) >= 400, timeout=120)
        producer.pause_queue("default")
        wait_for(lambda: producer.batch_progress(batch).get("running", 0) == 0, timeout=30)
    finally:
        worker.terminate()
        worker.wait(60)
    producer.resume_queue("default")
    # one live worker, on another queue: the overview counts it and still flags
    # the waiting jobs nobody runs
    idle = _worker(db_url, "--queues", "emails")
    try:
        wait_for(
            lambda: any(w.queues == ["emails"] for w in producer.workers()),
            timeout=60,
            what="the idle worker",
        )
        _screenshots(server, page, failed[0], batch, SCREENSHOTS or str(tmp_path))
    finally:
        idle.terminate()
        idle.wait(60)
    assert page.errors == []


def _screenshots(server, page, failed: int, batch: int, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    page.set_viewport_size({"width": 1280, "height": 800})
    shots = {
        "overview": "/",
        "jobs": "/jobs?state=failed",
        "job": f"/jobs/{failed}",
        "batch": f"/batches/{batch}",
    }
    for name, path in shots.items():
        response = page.goto(server.url + path)
        assert response is not None and response.status == 200, path
        page.wait_for_timeout(300)  # the live script's first refresh
        page.screenshot(path=os.path.join(out, f"{name}.png"))
        if name == "jobs":
            assert page.locator("main").inner_text().count("fragile") == 3
        if name == "job":
            assert "/nonexistent/flag-0 is missing" in page.locator("main").inner_text()
        if name == "batch":
            percent = int(page.locator(".bar.big span").inner_text().rstrip("%"))
            assert 0 < percent < 100
            assert page.locator("#batch-state").inner_text().strip() == "running"
