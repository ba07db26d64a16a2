#!/usr/bin/env bash
# mysqlclient (MySQLdb, the optional C driver of the MySQL backend: driver=mysqlclient
# in the URL, and Django's MySQL driver) in $PYTHON's environment. It builds against
# the MariaDB (or MySQL) client library: libmariadb-dev is installed with apt-get when
# its headers are missing and we may. Exits non-zero, saying why, when it cannot.
set -u
say() { echo "ensure-mysqlclient: $*" >&2; }
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import MySQLdb' 2>/dev/null && exit 0
if ! pkg-config --exists mysqlclient 2>/dev/null && ! pkg-config --exists mariadb 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing libmariadb-dev (mysqlclient builds against it)"
    { apt-get update -qq && apt-get install -y -qq libmariadb-dev pkg-config; } >&2 || exit 1
  else
    say "mysqlclient needs the MariaDB (or MySQL) client headers: apt-get install libmariadb-dev pkg-config"
    exit 1
  fi
fi
"$PYTHON" -m pip install -q "mysqlclient>=2.2" >&2
