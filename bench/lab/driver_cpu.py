"""Client-side CPU of Conveyor's MariaDB claim and finish, PyMySQL vs mysqlclient.

The backend's own statements (conveyor.backends.mysql.dialect.Q) as the backend
runs them, on one connection set up as MySQLSession._connect sets its up
(utf8mb4, autocommit, DictCursor, CLIENT.FOUND_ROWS, UTC, READ COMMITTED):

  claim, one transaction:  change_take (INSERT, lastrowid) + job_claim_pick
                           (LIMIT 100, FOR UPDATE SKIP LOCKED) + job_claim_update
                           + job_get_claimed (SELECT * of the 100 rows)
  finish, one transaction: change_take + job_finalize_pick (ids and tokens IN
                           lists, FOR UPDATE) + job_succeed_many

Per round and driver: ITER x 100 jobs enqueued by the app (not timed), then ITER
claims + finishes timed by time.process_time() (this process's CPU: the driver's
and Python's, not the server's) and perf_counter (wall, server included). The
drivers alternate, the order flipped each round.

    .venv/bin/python bench/lab/driver_cpu.py \
        mysql://root@127.0.0.1:3306/conveyor_mc_micro [rounds] [iterations]
"""

from __future__ import annotations

import json
import secrets
import statistics
import sys
import time
from typing import Any

import MySQLdb
import MySQLdb.constants.CLIENT
import MySQLdb.cursors
import pymysql
import pymysql.cursors
from pymysql.constants import CLIENT

from conveyor import Conveyor
from conveyor.backends.mysql.dialect import Q
from conveyor.backends.mysql.session import parse_url

QUEUE = "mc_bench"
BATCH = 100
SETUP = (
    "SET time_zone = '+00:00'",
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
)


def connect_pymysql(kw: dict[str, Any]) -> Any:
    return pymysql.connect(
        **kw,
        charset="utf8mb4",
        autocommit=True,
        cursorclass=pymysql.cursors.DictCursor,
        client_flag=CLIENT.FOUND_ROWS,
    )


def connect_mysqldb(kw: dict[str, Any]) -> Any:
    return MySQLdb.connect(
        host=kw["host"],
        port=kw["port"],
        user=kw["user"],
        password=kw["password"],
        database=kw["database"],
        connect_timeout=int(kw["connect_timeout"]),  # an int here (PyMySQL: a float)
        charset="utf8mb4",
        autocommit=True,
        cursorclass=MySQLdb.cursors.DictCursor,
        client_flag=MySQLdb.constants.CLIENT.FOUND_ROWS,
    )


def one_cycle(conn: Any, schema_version: int) -> int:
    """Claim up to BATCH jobs and finish them: the jobs done."""
    base = {
        "worker_id": "mc-bench",
        "lease_s": 30.0,
        "now": None,
        "tasks": None,
        "task_list": (None,),
        "schema_version": schema_version,
    }
    conn.begin()
    cur = conn.cursor()
    cur.execute(Q["change_take"])
    change = int(cur.lastrowid)
    cur.execute(Q["job_claim_pick"], {**base, "queue": QUEUE, "limit": BATCH})
    ids = [int(r["id"]) for r in cur.fetchall()]
    if not ids:
        cur.close()
        conn.commit()
        return 0
    token = secrets.token_hex(16)
    cur.execute(
        Q["job_claim_update"], {**base, "ids": tuple(ids), "token": token, "change": change}
    )
    assert cur.rowcount == len(ids)
    cur.execute(Q["job_get_claimed"], {"ids": tuple(ids)})
    rows = list(cur.fetchall())
    cur.close()
    conn.commit()
    # the handlers ran; every job succeeded with result null
    conn.begin()
    cur = conn.cursor()
    cur.execute(Q["change_take"])
    change = int(cur.lastrowid)
    cur.execute(
        Q["job_finalize_pick"],
        {"ids": tuple(r["id"] for r in rows), "tokens": tuple(r["lease_token"] for r in rows)},
    )
    held = {int(r["id"]): r for r in cur.fetchall()}
    cur.execute(
        Q["job_succeed_many"],
        {
            "ids": tuple(sorted(held)),
            "uniform": True,
            "result_json": "null",
            "results": "{}",
            "worker_id": "mc-bench",
            "now": None,
            "change": change,
        },
    )
    done = cur.rowcount
    cur.close()
    conn.commit()
    return int(done)


def main() -> None:
    url = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    app = Conveyor(url)
    app.backend.migrate()

    @app.task(queue=QUEUE, name="mc_bench.noop")
    def noop(i: int = 0) -> None: ...

    schema_version = app.backend.latest_schema
    kw = parse_url(url)
    drivers = {"pymysql": connect_pymysql, "mysqldb": connect_mysqldb}
    conns = {}
    for name, connect in drivers.items():
        conns[name] = connect(kw)
        with conns[name].cursor() as cur:
            for s in SETUP:
                cur.execute(s)
    # one warm-up cycle each
    for name, conn in conns.items():
        app.enqueue_many("mc_bench.noop", [(i,) for i in range(BATCH)], queue=QUEUE)
        assert one_cycle(conn, schema_version) == BATCH, name
    results: dict[str, list[dict[str, float]]] = {n: [] for n in drivers}
    for rnd in range(rounds):
        order = list(drivers) if rnd % 2 == 0 else list(reversed(drivers))
        for name in order:
            app.delete_jobs(queue=QUEUE)
            for _ in range(iters):
                app.enqueue_many("mc_bench.noop", [(i,) for i in range(BATCH)], queue=QUEUE)
            conn = conns[name]
            c0, w0 = time.process_time(), time.perf_counter()
            done = sum(one_cycle(conn, schema_version) for _ in range(iters))
            c1, w1 = time.process_time(), time.perf_counter()
            assert done == iters * BATCH, (name, done)
            r = {"cpu_us": (c1 - c0) / done * 1e6, "wall_us": (w1 - w0) / done * 1e6}
            results[name].append(r)
            print(
                f"round {rnd + 1} {name:8s} client CPU {r['cpu_us']:6.1f} µs/job, "
                f"wall {r['wall_us']:6.1f} µs/job",
                flush=True,
            )
    app.delete_jobs(queue=QUEUE)
    summary = {
        n: {k: round(statistics.median(x[k] for x in rs), 1) for k in ("cpu_us", "wall_us")}
        for n, rs in results.items()
    }
    saved = [
        p["cpu_us"] - m["cpu_us"]
        for p, m in zip(results["pymysql"], results["mysqldb"], strict=True)
    ]
    print(
        json.dumps(
            {"median": summary, "cpu_saved_us_per_job_by_round": [round(s, 1) for s in saved]}
        )
    )


if __name__ == "__main__":
    main()
