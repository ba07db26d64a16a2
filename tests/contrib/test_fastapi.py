"""``conveyor.contrib.fastapi.conveyor_lifespan`` in a real uvicorn process, on
each database: the mounted API and dashboard, a worker in the web process, and
its graceful stop when uvicorn is told to stop (SIGTERM) mid-job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conveyor import ConfigError, Conveyor, JobState
from conveyor.contrib.fastapi import conveyor_lifespan
from tests.conftest import only_on
from tests.dashboard.conftest import browser, page  # noqa: F401  (fixtures)
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def wait_for(check, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Served:
    def __init__(self, db_url: str, tmp_path: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "uvicorn.log"
        env = {**os.environ, "CONVEYOR_DATABASE_URL": db_url, "PYTHONPATH": str(ROOT)}
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "tests.contrib.fastapi_app:app", "--port",
                 str(self.port)],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(self.log.read_text())
        try:
            return httpx.get(self.base + "/conveyor/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> bool:
        """SIGTERM, as a process manager stops it: True once uvicorn ran the
        lifespan's shutdown and exited (re-raising the signal it caught, as
        uvicorn does: status -15)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        return code in (0, -signal.SIGTERM) and "Application shutdown complete" in (
            self.log.read_text()
        )


@pytest.fixture
def served(db_url: str, tmp_path: Path) -> Iterator[Served]:
    Conveyor(db_url).migrate()
    s = Served(db_url, tmp_path)
    try:
        wait_for(s.up, what="uvicorn to serve the app")
        yield s
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(30)


def test_mounted_api_dashboard_and_in_process_worker(served: Served, db_url: str) -> None:
    job_id = httpx.post(served.base + "/sums", params={"a": 2, "b": 3}).json()["job"]

    def done() -> bool:
        job = httpx.get(f"{served.base}/conveyor/v1/jobs/{job_id}").json()
        return job["state"] == "succeeded" and job["result"] == 5

    wait_for(done, what="the web process's worker to run the job")
    home = httpx.get(served.base + "/conveyor/")
    assert home.status_code == 200 and "Conveyor" in home.text
    # the server's perimeter holds under the mount: an unknown Host is refused
    rebound = httpx.get(served.base + "/conveyor/v1/jobs", headers={"Host": "attacker.example"})
    assert rebound.status_code == 400
    assert served.stop(), served.log.read_text()


@only_on("sqlite")  # the pages are the same on every database
def test_the_dashboard_works_under_its_prefix(served: Served, page) -> None:  # noqa: F811
    """Mounted at /conveyor, the dashboard's links, styles, scripts, forms and the
    requests its scripts make all stay under /conveyor (none reach the web app's
    own routes, which 404 or answer something else)."""
    job_id = httpx.post(served.base + "/sums", params={"a": 1, "b": 1}).json()["job"]
    page.goto(served.base + "/conveyor/")
    styled = page.evaluate("() => document.styleSheets[0].cssRules.length")
    assert styled > 0, "the stylesheet did not load under the prefix"
    page.click("nav a:has-text('Jobs')")
    page.wait_for_url(served.base + "/conveyor/jobs")
    page.click(f"a:text-is('{job_id}')")
    page.wait_for_url(f"{served.base}/conveyor/jobs/{job_id}")
    paths = page.evaluate(
        """() => [...document.querySelectorAll('[href],[src],[action]')]
              .map(e => e.getAttribute('href') || e.getAttribute('src') || e.getAttribute('action'))
              .filter(p => p.startsWith('/'))"""
    )
    assert paths and all(p.startswith("/conveyor/") for p in paths), paths
    sent = page.evaluate(
        "async () => (await api('POST', '/v1/jobs', {task: 'add', args: [2, 2]})).status"
    )
    assert sent == 201  # the scripts' requests go to the mounted API too
    assert page.errors == []


def test_shutdown_lets_a_running_job_finish(served: Served, db_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    created = httpx.post(
        served.base + "/conveyor/v1/jobs", json={"task": "slow", "args": [2, str(marker)]}
    )
    assert created.status_code == 201
    wait_for(marker.exists, what="the job to start")
    assert served.stop(), served.log.read_text()  # the lifespan stops the worker
    job = Conveyor(db_url).get_job(created.json()["id"])
    assert (job.state, job.result, job.attempts) == (JobState.SUCCEEDED, "finished", 1)


def test_bad_arguments_are_refused_at_once(tmp_path: Path) -> None:
    app = Conveyor(f"sqlite:///{tmp_path / 'c.db'}")
    with pytest.raises(ConfigError, match="prefix"):
        conveyor_lifespan(app, prefix="conveyor")
    with pytest.raises(ConfigError, match="worker=True"):
        conveyor_lifespan(app, worker_options={"concurrency": 2})
