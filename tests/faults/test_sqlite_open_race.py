"""Many processes opening one new SQLite file at the same instant.

Switching a file to WAL needs it to itself, and SQLite answers "database is
locked" at once (its busy timeout does not apply) while another process is
creating or switching it: every process must still open the file and migrate.
"""

from __future__ import annotations

import subprocess
import sys
import time

OPENER = """
import sys, time
from conveyor import Conveyor
start = float(sys.argv[2])
while time.time() < start:
    pass
app = Conveyor(sys.argv[1])
app.migrate()
print(app.schema_version())
"""


def test_processes_opening_a_new_file_together_all_succeed(tmp_path):
    for round_ in range(3):
        url = f"sqlite:///{tmp_path}/race{round_}.db"
        start = time.time() + 1.5
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", OPENER, url, str(start)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(8)
        ]
        results = [p.communicate(timeout=60) for p in procs]
        failures = [err for p, (_, err) in zip(procs, results, strict=True) if p.returncode]
        assert not failures, failures[0]
        versions = {out.strip() for out, _ in results}
        assert len(versions) == 1, versions
