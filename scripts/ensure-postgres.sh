#!/usr/bin/env bash
# Print a PostgreSQL URL the test suite can create databases on, starting a server
# if none answers. Progress goes to stderr; only the URL goes to stdout.
#   1. $CONVEYOR_TEST_POSTGRES_URL, if set (must answer);
#   2. localhost:5432 (starting the machine's own cluster with pg_ctlcluster if it is down);
#   3. a throwaway cluster on 127.0.0.1:55432 made with the initdb/pg_ctl found here
#      (as the "postgres" user when run as root, since initdb refuses root);
#   4. failing that, a message that says how to get one.
set -u
say() { echo "ensure-postgres: $*" >&2; }
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-$HERE/../.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
answers() { "$PYTHON" -c 'import sys, psycopg; psycopg.connect(sys.argv[1], connect_timeout=3).close()' "$1" 2>/dev/null; }

if [ -n "${CONVEYOR_TEST_POSTGRES_URL:-}" ]; then
  if answers "$CONVEYOR_TEST_POSTGRES_URL"; then echo "$CONVEYOR_TEST_POSTGRES_URL"; exit 0; fi
  say "CONVEYOR_TEST_POSTGRES_URL=$CONVEYOR_TEST_POSTGRES_URL does not answer"; exit 1
fi

LOCAL=postgresql://postgres@127.0.0.1:5432/postgres
if answers "$LOCAL"; then echo "$LOCAL"; exit 0; fi

if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  for v in $(ls /etc/postgresql 2>/dev/null); do
    say "starting the machine's PostgreSQL $v cluster"
    pg_ctlcluster --skip-systemctl-redirect "$v" main start >&2 2>&1 || true
  done
  for _ in $(seq 1 20); do answers "$LOCAL" && { echo "$LOCAL"; exit 0; }; sleep 0.5; done
fi

PGBIN=""
for d in $(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/x)") /usr/lib/postgresql/*/bin /usr/local/pgsql/bin; do
  if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then PGBIN=$d; break; fi
done
if [ -z "$PGBIN" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "no PostgreSQL found: installing Debian's postgresql package"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2 2>&1
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && PGBIN=$d; done
fi
if [ -z "$PGBIN" ]; then
  say "no PostgreSQL server answers on 127.0.0.1:5432 and no initdb/pg_ctl was found."
  say "Install PostgreSQL (e.g. apt-get install postgresql) or set CONVEYOR_TEST_POSTGRES_URL."
  exit 1
fi

DIR=${CONVEYOR_PG_DIR:-/tmp/conveyor-pg}
PORT=55432
THROWAWAY=postgresql://postgres@127.0.0.1:$PORT/postgres
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi; }
if answers "$THROWAWAY"; then echo "$THROWAWAY"; exit 0; fi
mkdir -p "$DIR"; [ "$(id -u)" = 0 ] && chown postgres: "$DIR"
if [ ! -f "$DIR/data/PG_VERSION" ]; then
  say "creating a throwaway cluster in $DIR with $PGBIN/initdb"
  as_pg "$PGBIN/initdb -D $DIR/data -U postgres --auth=trust -E UTF8 >/dev/null" >&2 || exit 1
fi
say "starting the throwaway cluster on 127.0.0.1:$PORT"
as_pg "$PGBIN/pg_ctl -D $DIR/data -l $DIR/log -w -o '-p $PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$DIR -c max_connections=200' start" >&2 || {
  say "could not start it; see $DIR/log"; exit 1; }
answers "$THROWAWAY" && { echo "$THROWAWAY"; exit 0; }
say "the throwaway cluster started but does not answer; see $DIR/log"; exit 1
