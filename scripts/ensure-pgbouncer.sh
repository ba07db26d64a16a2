#!/usr/bin/env bash
# tests/deploy run Conveyor behind PgBouncer in transaction mode, as Debian 12 ships
# it (1.18): install Debian's package when it is missing and we may (root with
# apt-get). The tests start PgBouncer processes of their own on free ports, so the
# service the package may start (on 6432) is stopped and disabled: nothing of it
# is used. Otherwise say how to get one.
set -u
PGBOUNCER=${CONVEYOR_TEST_PGBOUNCER:-/usr/sbin/pgbouncer}
[ -x "$PGBOUNCER" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "ensure-pgbouncer: installing Debian's pgbouncer for the deployment tests" >&2
  if { apt-get update -qq && apt-get install -y -qq pgbouncer; } >&2 && [ -x "$PGBOUNCER" ]; then
    { service pgbouncer stop || true; systemctl disable --now pgbouncer || true; } >/dev/null 2>&1
    exit 0
  fi
fi
echo "ensure-pgbouncer: the deployment tests need PgBouncer at $PGBOUNCER:" \
  "install it (apt-get install pgbouncer) or set CONVEYOR_TEST_PGBOUNCER to a pgbouncer binary" >&2
exit 1
