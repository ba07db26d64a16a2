"""What a lone `send` costs the PostgreSQL server (issue 41), by pgbench: one
client, prepared statements, autocommit, `-T` seconds each, alternating rounds.

    python bench/lab/send_cost.py [--rounds 2]

Makes the database ``lab_send_cost`` (dropped first) on $PEERBENCH_PG (as the
other benchmarks; 127.0.0.1:5432 by default), migrated, and runs, each
as its own pgbench script: ``SELECT 1`` (a round trip); an INSERT of one integer
into a two-column table (a durable commit's floor); a plain send's own INSERT
(job_insert_one with a no-op job's values, as the backend sends it); the same
with its NOTIFY taken out; and the same with triggers off
(``session_replication_role = replica``: the count rollups' two statement
triggers do not fire). Prints pgbench's average latency of each, in ms.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from conveyor import Conveyor
from conveyor.backends.postgres.backend import Q

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _bench import PG_BASE, SCRATCH, fresh_database

DB = "lab_send_cost"


def send_sql(url: str) -> str:
    """The literal INSERT a plain send runs (the statement the backend prepares
    on each connection, with a no-op job's values)."""
    app = Conveyor(url)

    @app.task(name="noop", queue="bench")
    async def noop(t: float, warm: bool) -> None:
        pass

    app.migrate()
    backend: Any = app.backend
    seen: dict[str, Any] = {}
    rows = backend._rows

    def spy(name: str, params: dict[str, Any], **kw: Any) -> Any:
        if name == "job_insert_one":
            seen["params"] = backend._params(params)
        return rows(name, params, **kw)

    backend._send_one = lambda job, now: None  # the statement by psycopg, to be seen
    backend._rows = spy
    noop.send(0.0, False)
    app.close()
    with psycopg.connect(url) as conn:
        sql = psycopg.ClientCursor(conn).mogrify(Q["job_insert_one"], seen["params"])
    return " ".join(sql.split()) + ";\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("-T", "--seconds", type=int, default=6)
    args = p.parse_args()
    fresh_database("postgres", DB, SCRATCH / f"{DB}.db")
    url = f"{PG_BASE}/{DB}"
    send = send_sql(url)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE floor_t (id bigserial PRIMARY KEY, v int)")
    no_notify = send.replace("SELECT pg_notify(", "SELECT (")
    assert no_notify != send, "the send's NOTIFY was not found"
    scripts = {
        "SELECT 1": ("SELECT 1;\n", {}),
        "INSERT of one integer": ("INSERT INTO floor_t (v) VALUES (1);\n", {}),
        "a send's INSERT": (send, {}),
        "  without its NOTIFY": (no_notify, {}),
        "  with triggers off": (send, {"PGOPTIONS": "-c session_replication_role=replica"}),
    }
    info = psycopg.conninfo.conninfo_to_dict(url)
    base = ["pgbench", "-n", "-c1", "-M", "prepared", "-T", str(args.seconds)]
    base += ["-h", str(info.get("host", "127.0.0.1")), "-p", str(info.get("port", 5432))]
    base += ["-U", str(info.get("user", "postgres")), DB]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(1, args.rounds + 1):
            for name, (sql, env) in scripts.items():
                f = Path(tmp) / "script.sql"
                f.write_text(sql)
                out = subprocess.run(
                    [*base, "-f", str(f)],
                    env={**os.environ, **env},
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                latency = next(line for line in out.splitlines() if "latency average" in line)
                print(f"round {r}  {name:24s} {latency.split('=')[1].strip()}")
    with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as c:
        c.execute(f"DROP DATABASE {DB} WITH (FORCE)")


if __name__ == "__main__":
    main()
