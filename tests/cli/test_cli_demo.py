"""`conveyor demo` end to end: worker processes on a fresh SQLite file, then a summary."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from .conftest import Invoke, conveyor_cmd, subprocess_env


def test_demo_runs_to_completion(tmp_path: Path, invoke: Invoke) -> None:
    env = {**subprocess_env(), "TMPDIR": str(tmp_path), "COLUMNS": "200"}
    proc = subprocess.run(
        conveyor_cmd("demo", "--jobs", "60"),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for text in (
        "enqueued 60 jobs",
        "summary",
        "succeeded",
        "failed",
        "retries",
        "workers stopped with SIGTERM (exit codes: 0, 0)",
        "jobs list --state failed",
        "created batch 1 'demo-batch': 100 flaky jobs, on_complete=batch_done",
        # inputs n % 4 == 3 fail all three attempts: 25 of 100
        "batch 1 (demo-batch) closed: completed_with_failures - 75 succeeded, 25 failed",
        "returned 'batch 1 closed with 25 failed, 75 succeeded'",
    ):
        assert text in out

    # The database is a fresh file in a temporary folder, and the printed commands work.
    path = Path(re.search(r"database: (\S+)", out).group(1))
    assert path.parent.parent == tmp_path and path.exists()
    url = f"sqlite:///{path}"
    assert f"conveyor -d {url} status" in out
    status = json.loads(invoke("status", "--json", url=url).stdout)
    counts = status["queues"]
    # the 60 jobs, the batch's 100 and its on_complete job
    assert sum(sum(c.values()) for c in counts.values()) == 60 + 100 + 1
    assert status["batches"] == {"running": 0, "shown": []}
    assert sum(c["failed"] for c in counts.values()) > 0
    assert all(c["running"] == c["available"] == c["scheduled"] == 0 for c in counts.values())
    failed_id = re.search(r"jobs show (\d+)", out).group(1)
    assert invoke("jobs", "show", failed_id, url=url).exit_code == 0
    assert (
        json.loads(invoke("jobs", "show", failed_id, "--json", url=url).stdout)["batch_id"] is None
    )

    # The batch: the printed command shows it, closed, with its final counts.
    assert f"conveyor -d {url} batches show 1" in out
    batch = json.loads(invoke("batches", "show", "1", "--json", url=url).stdout)
    assert (batch["name"], batch["state"]) == ("demo-batch", "completed_with_failures")
    assert batch["final_counts"] == {"succeeded": 75, "failed": 25}
    assert batch["closings"] == 1 and batch["on_complete"] == "batch_done"


def test_demo_without_a_batch(tmp_path: Path) -> None:
    env = {**subprocess_env(), "TMPDIR": str(tmp_path), "COLUMNS": "200"}
    proc = subprocess.run(
        conveyor_cmd("demo", "--jobs", "10", "--batch-items", "0", "--workers", "1"),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "enqueued 10 jobs" in proc.stdout
    assert "demo-batch" not in proc.stdout and "batches show" not in proc.stdout
