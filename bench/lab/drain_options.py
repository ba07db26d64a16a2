"""A drain by `conveyor worker --burst` with options of your choosing, beside the
CLI defaults, in alternating rounds, with the database server's CPU.

`conveyor bench` measures the worker with its defaults only (as users run it);
this asks what an option would change. Per round and option set: N no-op jobs
enqueued (1,000 per call) into the database given, then one worker process with
those options drains them; reported are the jobs/s over the worker's wall time
(start-up included) and the CPU per job of the database server's processes
(postgres or mariadbd, all of them: keep the server otherwise idle).

    .venv/bin/python bench/lab/drain_options.py \\
        -d mysql://root@127.0.0.1:3306/lab_opts --options "" "--concurrency 400"
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conveyor import Conveyor

CONVEYOR = os.path.join(os.path.dirname(sys.executable), "conveyor")
HZ = os.sysconf("SC_CLK_TCK")
APP = """\
import os
from conveyor import Conveyor
app = Conveyor(os.environ["CONVEYOR_DATABASE_URL"])

@app.task(name="lab_noop", queue="lab_drain")
async def noop() -> None:
    return None
"""


def server_ticks(url: str) -> int:
    """CPU of every process of the database server, summed: utime+stime, and
    cutime+cstime (PostgreSQL's backends are processes, gone when their
    connection ends: their time is then the postmaster's children's)."""
    name = "mariadbd" if url.startswith("mysql") else "postgres"
    pids = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split()
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])
    return total


def drain(url: str, options: str, jobs: int, workdir: Path) -> tuple[float, float]:
    """jobs/s over the worker's wall time, and the server's CPU per job (µs)."""
    app = Conveyor(url)
    task = app.task(name="lab_noop", queue="lab_drain")(lambda: None)
    for start in range(0, jobs, 1000):
        task.send_many([()] * min(1000, jobs - start))
    app.close()
    env = {**os.environ, "CONVEYOR_DATABASE_URL": url, "PYTHONPATH": str(workdir)}
    before, began = server_ticks(url), time.perf_counter()
    command = [CONVEYOR, "worker", "--app", "lab_app:app", "--queues", "lab_drain", "--burst"]
    subprocess.run(
        [*command, "--log-level", "warning", *shlex.split(options)],
        check=True,
        env=env,
        cwd=workdir,
    )
    wall = time.perf_counter() - began
    return jobs / wall, (server_ticks(url) - before) / HZ / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-d", "--database-url", required=True, help="a scratch database")
    parser.add_argument(
        "--options", nargs="+", default=["", "--concurrency 400"], help="option sets"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", "--jobs", type=int, default=20000)
    args = parser.parse_args()
    got: dict[str, list[tuple[float, float]]] = {o: [] for o in args.options}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "lab_app.py").write_text(APP)
        for r in range(args.rounds):
            order = args.options if r % 2 == 0 else list(reversed(args.options))
            for options in order:
                rate, server = drain(args.database_url, options, args.jobs, workdir)
                got[options].append((rate, server))
                print(
                    f"round {r + 1} [{options or 'defaults'}] {rate:8,.0f} jobs/s (wall), "
                    f"server {server:4.0f} µs/job",
                    flush=True,
                )
    print("\n| options | jobs/s, wall, median | server µs/job, median |")
    print("|---|---|---|")
    for options, runs in got.items():
        rate = statistics.median(g[0] for g in runs)
        server = statistics.median(g[1] for g in runs)
        print(f"| {options or 'defaults'} | {rate:,.0f} | {server:.0f} |")


if __name__ == "__main__":
    main()
