#!/usr/bin/env bash
# Conveyor beside PgQueuer, in one run, through the shared peer harness
# (../shared/bench/peers next to this repository). `make bench` runs this.
#
#   1. /tmp/peerbench/venv: pgqueuer 1.6.0, asyncpg, psycopg, uvloop, and this
#      repository (editable), so every library runs under the same interpreter;
#   2. PostgreSQL: $PEERBENCH_PG if set, else 127.0.0.1:5432 if it answers, else
#      the shared throwaway cluster (cluster.sh, 127.0.0.1:5433);
#   3. PgQueuer batch 100 and Conveyor on PostgreSQL in alternating rounds
#      (BENCH_ROUNDS, default 5), then PgQueuer batch 10 and Conveyor on SQLite once;
#      Conveyor by `conveyor worker` with the CLI's defaults (bench_conveyor.py
#      --cli, as users run it), 20,000 jobs each, appended to
#      /tmp/peerbench/results/conveyor-<timestamp>.jsonl;
#   4. Conveyor batches (bench/bench_batches.py: creating a 10,000-item batch,
#      progress of a 100,000-job batch, close delay) on PostgreSQL and SQLite,
#      appended to /tmp/peerbench/results/conveyor-batches-<timestamp>.jsonl;
#   5. Conveyor concurrency limits (bench/bench_limits.py: 3 rounds of drains of 20,000 no-op jobs
#      unlimited, with per-key limits and with a queue limit) on PostgreSQL and SQLite,
#      appended to /tmp/peerbench/results/conveyor-limits-<timestamp>.jsonl;
#   6. the Markdown table and the ratios, printed and written to bench/RESULTS.md
#      (with "Batches" and "Concurrency limits" sections);
#   7. the HTTP API (bench/bench_api.py: jobs created per second through
#      `conveyor server`, one POST per job and in bulk; 20,000 no-op jobs drained
#      by one remote HTTP worker in batches of 100 beside one in-process worker)
#      on PostgreSQL and SQLite, appended to
#      /tmp/peerbench/results/conveyor-api-<timestamp>.jsonl; its table is printed;
#   8. live events and metrics (bench/bench_events.py: drain by a `conveyor worker`
#      with and without an SSE client following, completion-to-client delay p50/p99,
#      a /metrics scrape on 1,000,000 jobs) on PostgreSQL and SQLite, appended to
#      /tmp/peerbench/results/conveyor-events-<timestamp>.jsonl; its table is printed;
#   9. `conveyor bench` (the CLI worker with its defaults) on PostgreSQL with --pgqueuer
#      (one worker process, then the drain by two each: --workers 2), on SQLite and on
#      MariaDB (scripts/ensure-mysql.sh), by PyMySQL and by mysqlclient, appended to
#      bench/RESULTS.md;
#  10. with BENCH_SCALE=1, bench/bench_scale.py (1/2/4 workers, 1M waiting, 10M finished,
#      a worker's RSS over 1M jobs), its section appended to bench/RESULTS.md.
#
# Environment: PEERBENCH_PG (server URL without a database), PEERBENCH_SHARED
# (the shared folder), BENCH_N (jobs per run, default 20000), BENCH_ROUNDS (alternating
# PgQueuer and Conveyor rounds, default 5).
set -euo pipefail
say() { echo "bench: $*" >&2; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
SHARED=${PEERBENCH_SHARED:-$REPO/../shared}
PEERS=$SHARED/bench/peers
for f in _common.py bench_pgqueuer.py summarize.py cluster.sh; do
  if [ ! -f "$PEERS/$f" ]; then
    say "the shared peer harness is missing: $PEERS/$f not found."
    say "It lives in shared/bench/peers beside this repository (set PEERBENCH_SHARED to override)."
    exit 1
  fi
done
PEERS=$(cd "$PEERS" && pwd)
export PEERBENCH_PEERS=$PEERS

SCRATCH=/tmp/peerbench
VENV=$SCRATCH/venv
PY=$VENV/bin/python
N=${BENCH_N:-20000}
mkdir -p "$SCRATCH/results"

# -- 1. the benchmark virtualenv --------------------------------------------------------
if [ ! -x "$PY" ]; then
  say "creating $VENV"
  python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
fi
if ! "$PY" -c 'import sys, pgqueuer, asyncpg, psycopg, psycopg_pool, uvloop
sys.exit(pgqueuer.__version__ != "1.6.0")' 2>/dev/null; then
  say "installing pgqueuer==1.6.0 asyncpg psycopg uvloop into $VENV"
  "$PY" -m pip install -q "pgqueuer==1.6.0" asyncpg "psycopg[binary,pool]" uvloop
fi
# Conveyor from THIS checkout (editable), reinstalled if the venv points elsewhere
# or lacks its dependencies (the server's: fastapi, uvicorn; httpx for bench_api).
if ! "$PY" -c 'import os, sys, conveyor, fastapi, uvicorn, httpx, pymysql
sys.exit(not os.path.realpath(conveyor.__file__).startswith(os.path.realpath(sys.argv[1]) + os.sep))' \
    "$REPO/src" 2>/dev/null; then
  say "installing Conveyor from $REPO into $VENV (editable)"
  "$PY" -m pip install -q -e "$REPO" httpx
fi

# -- 2. PostgreSQL ------------------------------------------------------------------------
answers() { "$PY" -c 'import sys, psycopg; psycopg.connect(sys.argv[1] + "/postgres", connect_timeout=3).close()' "$1" 2>/dev/null; }
if [ -n "${PEERBENCH_PG:-}" ]; then
  answers "$PEERBENCH_PG" || { say "PEERBENCH_PG=$PEERBENCH_PG does not answer"; exit 1; }
elif answers postgresql://postgres@127.0.0.1:5432; then
  export PEERBENCH_PG=postgresql://postgres@127.0.0.1:5432
else
  export PEERBENCH_PG=postgresql://postgres@127.0.0.1:5433
  if ! answers "$PEERBENCH_PG"; then
    if [ -z "${PGBIN:-}" ]; then
      for d in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin /usr/local/pgsql/bin; do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then PGBIN=$d; break; fi
      done
    fi
    if [ -z "${PGBIN:-}" ]; then
      say "no PostgreSQL answers on 127.0.0.1:5432 or :5433 and no initdb/pg_ctl was found;"
      say "install PostgreSQL 15 (apt-get install postgresql) or set PEERBENCH_PG."
      exit 1
    fi
    export PGBIN
    if [ ! -f "$SCRATCH/pgdata/PG_VERSION" ]; then
      say "creating the throwaway cluster in $SCRATCH/pgdata ($PGBIN)"
      bash "$PEERS/cluster.sh" init
    fi
    say "starting the throwaway cluster on 127.0.0.1:5433"
    bash "$PEERS/cluster.sh" start >&2
    answers "$PEERBENCH_PG" || { say "the throwaway cluster does not answer; see $SCRATCH/pg.log"; exit 1; }
  fi
fi
say "PostgreSQL: $PEERBENCH_PG ($("$PY" -c 'import sys, psycopg
with psycopg.connect(sys.argv[1] + "/postgres") as c: print(c.execute("show server_version").fetchone()[0])' "$PEERBENCH_PG"))"

# -- 3. the runs ------------------------------------------------------------------------
STAMP=$(date +%Y%m%d-%H%M%S)
OUT=$SCRATCH/results/conveyor-$STAMP.jsonl
CMDS=$SCRATCH/results/conveyor-$STAMP.cmds
: > "$CMDS"
run() {
  say "$*"
  echo "$*" >> "$CMDS"
  "$@" --out "$OUT" > /dev/null
}
T0=$(date +%s)
cd "$REPO"
# PgQueuer batch 100 and Conveyor on PostgreSQL in alternating rounds: the machine's
# speed drifts by a quarter between minutes, and a ratio of two runs made far apart
# measures that drift too. report.py pairs the rounds in file order.
for _ in $(seq "${BENCH_ROUNDS:-5}"); do
  run "$PY" "$PEERS/bench_pgqueuer.py" --n "$N" --runs 1 --batch-size 100 --label batch100
  run "$PY" bench/bench_conveyor.py --backend postgres --n "$N" --runs 1 --label postgres --cli
done
run "$PY" "$PEERS/bench_pgqueuer.py" --n "$N" --runs 1 --label batch10
run "$PY" bench/bench_conveyor.py --backend sqlite --n "$N" --runs 1 --label sqlite --cli
say "peer runs took $(( $(date +%s) - T0 ))s; results in $OUT"

# -- 4. batches (own script, own results file) ----------------------------------------------
BOUT=$SCRATCH/results/conveyor-batches-$STAMP.jsonl
T1=$(date +%s)
say "$PY bench/bench_batches.py"
echo "$PY bench/bench_batches.py --out $BOUT" >> "$CMDS"
"$PY" bench/bench_batches.py --out "$BOUT" > /dev/null
say "batch runs took $(( $(date +%s) - T1 ))s; results in $BOUT"

# -- 5. concurrency limits (own script, own results file) -----------------------------------
LOUT=$SCRATCH/results/conveyor-limits-$STAMP.jsonl
T2=$(date +%s)
say "$PY bench/bench_limits.py"
echo "$PY bench/bench_limits.py --out $LOUT" >> "$CMDS"
"$PY" bench/bench_limits.py --out "$LOUT" > /dev/null
say "limit runs took $(( $(date +%s) - T2 ))s; results in $LOUT"

# -- 6. the table and the ratios ----------------------------------------------------------
"$PY" bench/report.py "$OUT" --commands "$CMDS" --peers "$PEERS" --write bench/RESULTS.md \
  --command "${BENCH_COMMAND:-make bench}" --batches "$BOUT" --limits "$LOUT"

# -- 7. the HTTP API (own script, own results file) ------------------------------------------
AOUT=$SCRATCH/results/conveyor-api-$STAMP.jsonl
T3=$(date +%s)
say "$PY bench/bench_api.py"
echo "$PY bench/bench_api.py --out $AOUT" >> "$CMDS"
"$PY" bench/bench_api.py --n "$N" --out "$AOUT" | grep '^|' >&2
say "API runs took $(( $(date +%s) - T3 ))s; results in $AOUT"

# -- 8. live events and metrics (own script, own results file) --------------------------------
EOUT=$SCRATCH/results/conveyor-events-$STAMP.jsonl
T4=$(date +%s)
say "$PY bench/bench_events.py"
echo "$PY bench/bench_events.py --out $EOUT" >> "$CMDS"
"$PY" bench/bench_events.py --n "$N" --out "$EOUT" | grep '^|' >&2
say "event runs took $(( $(date +%s) - T4 ))s; results in $EOUT"

# -- 9. `conveyor bench`: the CLI a user runs, beside PgQueuer, appended to RESULTS.md ----------
T5=$(date +%s)
"$PY" -c 'import sys, psycopg
with psycopg.connect(sys.argv[1] + "/postgres", autocommit=True) as c:
    c.execute("DROP DATABASE IF EXISTS bench_cli WITH (FORCE)"); c.execute("CREATE DATABASE bench_cli")' "$PEERBENCH_PG"
{
  echo
  echo "## \`conveyor bench\` (the CLI worker with its defaults, as users run it)"
  echo
  echo "Command: \`conveyor bench -d $PEERBENCH_PG/bench_cli --jobs $N --pgqueuer\` and \`conveyor bench --jobs $N\` (a throwaway SQLite file)."
  echo
  "$VENV/bin/conveyor" bench -d "$PEERBENCH_PG/bench_cli" --jobs "$N" --pgqueuer
  echo
  echo "Two worker processes each: \`conveyor bench -d $PEERBENCH_PG/bench_cli --jobs $N --phases drain --workers 2 --pgqueuer\`"
  echo
  "$VENV/bin/conveyor" bench -d "$PEERBENCH_PG/bench_cli" --jobs "$N" --phases drain --workers 2 --pgqueuer
  echo
  "$VENV/bin/conveyor" bench --jobs "$N"
  # MariaDB beside them (scripts/ensure-mysql.sh finds or starts it; skipped if none)
  if MYSQL_BASE=$(PYTHON="$PY" bash "$REPO/scripts/ensure-mysql.sh"); then
    "$PY" -c 'import sys, pymysql
from conveyor.backends.mysql.backend import parse_url
c = pymysql.connect(**parse_url(sys.argv[1]), autocommit=True)
with c.cursor() as cur:
    cur.execute("DROP DATABASE IF EXISTS bench_cli")
    cur.execute("CREATE DATABASE bench_cli CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")' "$MYSQL_BASE"
    echo
    echo "MariaDB: \`conveyor bench -d ${MYSQL_BASE%/*}/bench_cli --jobs $N\`"
    echo
    "$VENV/bin/conveyor" bench -d "${MYSQL_BASE%/*}/bench_cli" --jobs "$N"
    # the same through the optional C driver (scripts/ensure-mysqlclient.sh installs it)
    if PYTHON="$PY" bash "$REPO/scripts/ensure-mysqlclient.sh"; then
      echo
      echo "MariaDB through mysqlclient: \`conveyor bench -d ${MYSQL_BASE%/*}/bench_cli?driver=mysqlclient --jobs $N\`"
      echo
      "$VENV/bin/conveyor" bench -d "${MYSQL_BASE%/*}/bench_cli?driver=mysqlclient" --jobs "$N"
    else
      say "no mysqlclient: its conveyor bench run is skipped"
    fi
  else
    say "no MySQL/MariaDB: its conveyor bench run is skipped"
  fi
} > "$SCRATCH/results/conveyor-cli-$STAMP.md"
cat "$SCRATCH/results/conveyor-cli-$STAMP.md" >> bench/RESULTS.md
say "conveyor bench took $(( $(date +%s) - T5 ))s"

# -- 10. scale (opt-in, ~20 min: BENCH_SCALE=1): 1/2/4 workers, 1M waiting, 10M finished, RSS --
if [ "${BENCH_SCALE:-0}" = 1 ]; then
  SOUT=$SCRATCH/results/conveyor-scale-$STAMP.jsonl
  say "$PY bench/bench_scale.py --out $SOUT"
  "$PY" bench/bench_scale.py --out "$SOUT" >&2
  { echo; "$PY" bench/bench_scale.py --markdown "$SOUT"; } >> "$REPO/bench/RESULTS.md"
  say "scale section appended to bench/RESULTS.md"
fi
