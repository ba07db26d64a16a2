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
    ):
        assert text in out

    # The database is a fresh file in a temporary folder, and the printed commands work.
    path = Path(re.search(r"database: (\S+)", out).group(1))
    assert path.parent.parent == tmp_path and path.exists()
    url = f"sqlite:///{path}"
    assert f"conveyor -d {url} status" in out
    counts = json.loads(invoke("status", "--json", url=url).stdout)["queues"]
    assert sum(sum(c.values()) for c in counts.values()) == 60
    assert sum(c["failed"] for c in counts.values()) > 0
    assert all(c["running"] == c["available"] == c["scheduled"] == 0 for c in counts.values())
    failed_id = re.search(r"jobs show (\d+)", out).group(1)
    assert invoke("jobs", "show", failed_id, url=url).exit_code == 0
