"""A worker started while its database is down (a server starting or restarting
along with its workers) waits for it, and runs jobs once it answers; one whose
database answers no (a wrong password) exits at once with that error."""

from __future__ import annotations

import time

import pytest

from conveyor import Conveyor

from ..runtime.conftest import Procs
from .conftest import PASSWORD, wait_until

pytestmark = pytest.mark.slow


def test_a_worker_started_before_its_database_waits_for_it(cluster, tmp_path):
    producer = Conveyor(cluster.url)
    producer.task(name="effect")(lambda *a: None)
    producer.migrate()
    cluster.stop()
    procs = Procs(cluster.url, tmp_path / "effects.log")
    try:
        w = procs.worker(connect_wait_s=60, heartbeat_s=0.5, worker_ttl_s=5)
        wait_until(lambda: "does not answer yet" in w.log.read_text(), 30, "the worker waiting")
        time.sleep(1.5)  # a few tries, quietly
        assert w.poll() is None, w.log.read_text()[-3000:]
        cluster.start()
        jobs = producer.tasks["effect"].send_many([(i,) for i in range(10)])
        wait_until(lambda: len(procs.lines("ran")) >= 10, 60, "jobs ran once the server was up")
        assert {producer.get_job(j.id).state for j in jobs} == {"succeeded"}
        log = w.log.read_text()
        assert log.count("does not answer yet") == 1, log[-3000:]
        assert "the database answers, after" in log
        assert "s3cret" not in log and PASSWORD not in log
        procs.drain_and_stop(producer, [w])
    finally:
        procs.cleanup()
        producer.close()


def test_a_wrong_password_is_not_waited_for(cluster, tmp_path):
    wrong = cluster.url.replace("@127.0.0.1", "x@127.0.0.1", 1)
    assert wrong != cluster.url
    procs = Procs(wrong, tmp_path / "effects.log")
    try:
        began = time.monotonic()
        w = procs.worker(connect_wait_s=60)
        assert w.wait(30) != 0
        assert time.monotonic() - began < 30
        log = w.log.read_text()
        assert "password authentication failed" in log, log[-3000:]
        assert "does not answer yet" not in log
    finally:
        procs.cleanup()


def test_a_server_started_before_its_database_waits_for_it(cluster, tmp_path):
    import os
    import subprocess
    import sys

    import httpx

    from tests.ports import free_port

    Conveyor(cluster.url).migrate()
    cluster.stop()
    port = free_port()
    log = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_DATABASE_URL"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "conveyor.cli.main", "-d", cluster.url, "server"),
                *("--port", str(port), "--wait-for-database", "60"),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "does not answer yet" in log.read_text(), 30, "the server waiting")
        assert proc.poll() is None, log.read_text()[-3000:]
        cluster.start()

        def up() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 60, "the server answering once its database did")
        assert "s3cret" not in log.read_text() and PASSWORD not in log.read_text()
    finally:
        proc.terminate()
        proc.wait(15)
