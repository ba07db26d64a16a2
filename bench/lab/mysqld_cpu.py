"""Run `conveyor bench` (arguments passed on) and, for each drain, the CPU the
MariaDB server (mysqld/mariadbd) spent while that drain's worker processes lived:
utime+stime of the server process from /proc/<pid>/stat when the first worker of
the drain appears and when the last one is gone, and the same per server thread
(the largest deltas are the worker's own connection threads; others' tests on a
shared server show up as the rest). Also the server's CPU over an idle window of
the same length before the run, as the background to subtract.

    .venv/bin/python bench/lab/mysqld_cpu.py \
        -d mysql://root@127.0.0.1:3306/conveyor_mc_x --phases drain -n 20000

Only worker processes whose environment carries the same CONVEYOR_DATABASE_URL
count (other people's benchmarks on the same machine are ignored).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pymysql

HZ = os.sysconf("SC_CLK_TCK")
POLL_S = 0.05


def server_pid() -> int:
    for name in ("mariadbd", "mysqld"):
        out = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split()
        if out:
            return int(out[0])
    raise SystemExit("no mariadbd/mysqld process")


def ticks(stat_path: str) -> int:
    with open(stat_path) as f:
        text = f.read()
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def threads(pid: int) -> dict[int, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = ticks(f"/proc/{pid}/task/{tid}/stat")
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def conn_tids(poll: pymysql.connections.Connection, db: str) -> set[int]:
    """The server threads (OS tids) of the connections to ``db`` (MariaDB's
    information_schema.PROCESSLIST has TID)."""
    with poll.cursor() as cur:
        cur.execute("SELECT TID FROM information_schema.PROCESSLIST WHERE DB = %s", (db,))
        return {int(r[0]) for r in cur.fetchall()}


def my_workers(url: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            if b"conveyor.cli.main\0worker" not in cmd:
                continue
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"CONVEYOR_DATABASE_URL={url}".encode() in env:
            found.append(int(entry))
    return found


def main(argv: list[str]) -> None:
    url = argv[argv.index("-d") + 1]
    pid = server_pid()
    db = url.rsplit("/", 1)[1].split("?")[0]
    poll = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    idle_s = 5.0
    t0, c0 = time.monotonic(), ticks(f"/proc/{pid}/stat")
    time.sleep(idle_s)
    idle_rate = (ticks(f"/proc/{pid}/stat") - c0) / HZ / (time.monotonic() - t0)
    print(
        f"[mysqld_cpu] server pid {pid}; background before the run: {idle_rate * 1e3:.1f} ms CPU/s"
    )
    exe = Path(sys.executable).with_name("conveyor")
    bench = subprocess.Popen([str(exe), "bench", *argv])
    drains = []
    while bench.poll() is None:
        if not my_workers(url):
            time.sleep(POLL_S)
            continue
        w0, p0, th0 = time.monotonic(), ticks(f"/proc/{pid}/stat"), threads(pid)
        ours: set[int] = set()
        while my_workers(url):
            ours |= conn_tids(poll, db)
            time.sleep(POLL_S)
        w1, p1, th1 = time.monotonic(), ticks(f"/proc/{pid}/stat"), threads(pid)
        deltas = sorted(
            ((th1[t] - th0.get(t, 0), t) for t in th1 if th1[t] - th0.get(t, 0) > 0), reverse=True
        )
        d = {
            "wall_s": w1 - w0,
            "cpu_s": (p1 - p0) / HZ,
            "top": [(t, n / HZ) for n, t in deltas[:6]],
        }
        d["ours_s"] = sum(th1.get(t, 0) - th0.get(t, 0) for t in ours) / HZ
        d["ours"] = sorted(ours)
        drains.append(d)
        print(
            f"[mysqld_cpu] drain {len(drains)}: workers lived {d['wall_s']:.2f} s, "
            f"server CPU {d['cpu_s']:.2f} s, of which the threads of connections to "
            f"{db} {d['ours']} {d['ours_s']:.2f} s; busiest threads (tid, s): "
            + ", ".join(f"{t}:{s:.2f}" for t, s in d["top"]),
            flush=True,
        )
    jobs = int(argv[argv.index("-n") + 1]) if "-n" in argv else 20000
    for i, d in enumerate(drains, 1):
        bg = idle_rate * d["wall_s"]
        print(
            f"[mysqld_cpu] drain {i}: server {d['cpu_s'] / jobs * 1e6:.0f} µs/job "
            f"({(d['cpu_s'] - bg) / jobs * 1e6:.0f} less the background), "
            f"the threads of our connections {d['ours_s'] / jobs * 1e6:.0f} µs/job"
        )
    sys.exit(bench.returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
