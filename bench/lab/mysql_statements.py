"""Where a MariaDB drain's server time goes, statement by statement: the server's
slow query log, at a threshold of 0 s, over one `conveyor bench --phases drain`
round, grouped by statement (numbers masked) and summed.

    .venv/bin/python bench/lab/mysql_statements.py \
        -d mysql://root@127.0.0.1:3306/conveyor_lab --phases drain --rounds 1 -n 20000

The log is global: it holds every client's statements, so only those run in the
measured database count. It changes three of the server's global settings for
the run (slow_query_log, its file, long_query_time) and puts them back after.
Query_time is wall time in the server, lock waits included; with every statement
logged the drain runs slower than unlogged. The shares are what to read.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pymysql

SETTINGS = ("slow_query_log", "slow_query_log_file", "long_query_time", "log_slow_verbosity")


def main(argv: list[str]) -> None:
    url = argv[argv.index("-d") + 1]
    db = url.rsplit("/", 1)[1].split("?")[0]
    admin = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{db}`")
        cur.execute("SELECT " + ", ".join(f"@@global.{s}" for s in SETTINGS))
        saved = dict(zip(SETTINGS, cur.fetchone(), strict=True))
    log = Path(tempfile.mkdtemp(prefix="conveyor-slow-")) / "slow.log"
    log.parent.chmod(0o777)  # the server writes it
    exe = Path(sys.executable).with_name("conveyor")
    try:
        with admin.cursor() as cur:
            cur.execute("SET GLOBAL slow_query_log_file = %s", [str(log)])
            cur.execute("SET GLOBAL log_slow_verbosity = 'query_plan,innodb'")
            cur.execute("SET GLOBAL long_query_time = 0")
            cur.execute("SET GLOBAL slow_query_log = 1")
        subprocess.run([str(exe), "bench", *argv], check=True)
    finally:
        with admin.cursor() as cur:
            cur.execute("SET GLOBAL slow_query_log = 0")
            for name in ("slow_query_log_file", "long_query_time", "log_slow_verbosity"):
                cur.execute(f"SET GLOBAL {name} = %s", [saved[name]])
            cur.execute("SET GLOBAL slow_query_log = %s", [saved["slow_query_log"]])
    text = log.read_text(errors="replace")
    shutil.rmtree(log.parent, ignore_errors=True)
    report(text, db)


def report(text: str, db: str, top: int = 15) -> None:
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0])
    for entry in re.split(r"\n(?=# User@Host)", text):
        if f"Schema: {db} " not in entry:
            continue
        m = re.search(r"Query_time: ([\d.]+).*?Rows_examined: (\d+)", entry, re.S)
        if not m:
            continue
        lines = [
            line
            for line in entry.splitlines()
            if line and not line.startswith(("#", "SET timestamp", "use "))
        ]
        key = re.sub(r"\d+", "N", " ".join(lines))[:80]
        t = totals[key]
        t[0] += 1
        t[1] += float(m.group(1))
        t[2] += int(m.group(2))
    whole = sum(t[1] for t in totals.values()) or 1.0
    print(f"\nserver time in {db}: {whole:.2f} s\n")
    print("| share | s | calls | rows examined per call | statement |\n|---|---|---|---|---|")
    for key, (calls, secs, rows) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"| {secs / whole:.0%} | {secs:.2f} | {calls:,.0f} | {rows / calls:,.0f} | `{key}` |")


if __name__ == "__main__":
    main(sys.argv[1:])
