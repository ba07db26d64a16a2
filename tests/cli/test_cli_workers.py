"""`conveyor workers`: list them, and stop a real worker process remotely."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from conveyor import Conveyor
from conveyor.records import WorkerInfo

from .conftest import Invoke, StartWorker


def test_list_flags_silent_workers(invoke: Invoke, db_url: str, app: Conveyor) -> None:
    app.migrate()
    assert invoke("workers", "list", url=db_url).stdout == "no workers running\n"
    assert json.loads(invoke("workers", "list", "--json", url=db_url).stdout) == []
    alive = WorkerInfo(id="h1:10:aa", hostname="h1", pid=10, queues=["a", "b"], concurrency=4)
    gone = WorkerInfo(id="h2:20:bb", hostname="h2", pid=20, queues=["default"], concurrency=1)
    app.backend.worker_heartbeat(worker=alive)
    five_min_ago = datetime.now(UTC) - timedelta(minutes=5)
    app.backend.worker_heartbeat(worker=gone, now=five_min_ago)

    table = invoke("workers", "list", url=db_url)
    assert table.exit_code == 0, table.output
    for text in ("h1:10:aa", "h2:20:bb", "a,b", "alive", "silent", "1 worker(s) silent for over"):
        assert text in table.stdout
    rows = {w["id"]: w for w in json.loads(invoke("workers", "list", "--json", url=db_url).stdout)}
    assert (rows["h1:10:aa"]["hostname"], rows["h1:10:aa"]["pid"]) == ("h1", 10)
    assert (rows["h1:10:aa"]["queues"], rows["h1:10:aa"]["concurrency"]) == (["a", "b"], 4)
    assert (rows["h1:10:aa"]["silent"], rows["h2:20:bb"]["silent"]) == (False, True)

    # Stopping a silent worker works but says it may never act on it.
    stopped = invoke("workers", "stop", "h2:20:bb", url=db_url)
    assert stopped.exit_code == 0, stopped.output
    assert "asked to stop" in stopped.stdout and "may be gone already" in stopped.stdout


def test_stop_unknown_worker(invoke: Invoke, db_url: str) -> None:
    invoke("migrate", url=db_url)
    result = invoke("workers", "stop", "nohost:1:zz", url=db_url)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: no worker with id 'nohost:1:zz'")
    assert len(result.stderr.splitlines()) == 1


def test_stop_a_running_worker(
    start_worker: StartWorker, invoke: Invoke, db_url: str, tmp_path: Path
) -> None:
    # --lease 3: a heartbeat every second, so the stop request is seen within about one.
    invoke("migrate", url=db_url)
    proc = start_worker("--queues", "default", "--lease", "3")
    deadline = time.monotonic() + 15
    while not (workers := json.loads(invoke("workers", "list", "--json", url=db_url).stdout)):
        assert proc.poll() is None, (tmp_path / "worker.log").read_text()
        assert time.monotonic() < deadline, "the worker never registered"
        time.sleep(0.1)
    (worker,) = workers
    assert worker["pid"] == proc.pid and worker["silent"] is False

    stopped = invoke("workers", "stop", worker["id"], url=db_url)
    assert stopped.exit_code == 0, stopped.output
    assert stopped.stdout.startswith(f"worker {worker['id']} (pid {proc.pid} on ")
    assert "asked to stop" in stopped.stdout and "note:" not in stopped.stdout

    assert proc.wait(timeout=10) == 0
    log = (tmp_path / "worker.log").read_text()
    assert "stop requested by an operator" in log and "Traceback" not in log
    assert invoke("workers", "list", url=db_url).stdout == "no workers running\n"
