"""`conveyor bench --phases drain` with the worker on PyMySQL and on mysqlclient,
alternating (the order flipped each round), one drain per run, and the MariaDB
server's CPU during each drain (see mysqld_cpu.py): the whole server's, and that
of the threads serving connections to the benchmark's database.

mysqlclient goes in through a measurement shim, not a port: /tmp/mc_shim/
sitecustomize.py (a copy is beside this file, mc_shim_sitecustomize.py) swaps
pymysql.connect for MySQLdb.connect in `conveyor worker` processes when
CONVEYOR_MC_DRIVER=mysqldb and PYTHONPATH has /tmp/mc_shim.

    .venv/bin/python bench/lab/driver_drain.py \
        mysql://root@127.0.0.1:3306/conveyor_mc_drain [rounds] [jobs]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pymysql
from mysqld_cpu import HZ, conn_tids, my_workers, server_pid, threads, ticks

SHIM = "/tmp/mc_shim"


def sample(url: str, db: str, pid: int, stop: threading.Event, out: dict) -> None:
    poll = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    while not stop.is_set():
        workers = my_workers(url)
        if not workers:
            time.sleep(0.02)
            continue
        maps = ""
        w0, p0, th0 = time.monotonic(), ticks(f"/proc/{pid}/stat"), threads(pid)
        ours: set[int] = set()
        while alive := my_workers(url):
            try:  # mysqlclient loaded by then? (read while the worker lives)
                maps = Path(f"/proc/{alive[0]}/maps").read_text(errors="replace")
            except OSError:
                pass
            ours |= conn_tids(poll, db)
            time.sleep(0.05)
        w1, p1, th1 = time.monotonic(), ticks(f"/proc/{pid}/stat"), threads(pid)
        out.update(
            libmariadb="libmariadb" in maps or "_mysql" in maps,
            server_s=(p1 - p0) / HZ,
            ours_s=sum(th1.get(t, 0) - th0.get(t, 0) for t in ours) / HZ,
            lived_s=w1 - w0,
        )
        return


def run(url: str, jobs: int, driver: str) -> dict:
    db = url.rsplit("/", 1)[1]
    env = dict(os.environ)
    if driver == "mysqldb":
        env |= {"CONVEYOR_MC_DRIVER": "mysqldb", "PYTHONPATH": SHIM}
    exe = str(Path(sys.executable).with_name("conveyor"))
    server: dict = {}
    stop = threading.Event()
    t = threading.Thread(target=sample, args=(url, db, server_pid(), stop, server))
    t.start()
    cmd = [exe, "bench", "-d", url, "--phases", "drain", "-n", str(jobs), "--rounds", "1", "--json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    stop.set()
    t.join()
    d = json.loads(out)["results"]["drain"]
    assert server.get("libmariadb") == (driver == "mysqldb"), (driver, server)
    return {
        "jobs_per_s": d["jobs_per_s"],
        "wall_jobs_per_s": d["wall_jobs_per_s"],
        "worker_us": d["cpu_us_per_job"],
        "server_us": round(server["server_s"] / jobs * 1e6),
        "server_conn_us": round(server["ours_s"] / jobs * 1e6),
    }


def main() -> None:
    url = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    jobs = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    res: dict[str, list[dict]] = {"pymysql": [], "mysqldb": []}
    for rnd in range(rounds):
        order = ["pymysql", "mysqldb"] if rnd % 2 == 0 else ["mysqldb", "pymysql"]
        for driver in order:
            r = run(url, jobs, driver)
            res[driver].append(r)
            load = os.getloadavg()[0]
            print(f"round {rnd + 1} {driver:8s} {r}  load {load:.2f}", flush=True)
    med = {drv: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for drv, rs in res.items()}
    ratios = [
        m["jobs_per_s"] / p["jobs_per_s"]
        for p, m in zip(res["pymysql"], res["mysqldb"], strict=True)
    ]
    print(
        json.dumps(
            {"median": med, "mysqldb/pymysql jobs/s by round": [round(x, 2) for x in ratios]}
        )
    )


if __name__ == "__main__":
    main()
