#!/usr/bin/env bash
# Print a MySQL/MariaDB URL the test suite can create databases on, starting the
# machine's MariaDB if none answers. Progress goes to stderr; only the URL to stdout.
#   1. $CONVEYOR_TEST_MYSQL_URL, if set (must answer);
#   2. root@127.0.0.1:3306 (starting /usr/sbin/mariadbd with start-stop-daemon if it is down);
#   3. failing that, a message that says how to get one.
set -u
say() { echo "ensure-mysql: $*" >&2; }
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-$HERE/../.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
answers() {
  "$PYTHON" - "$1" 2>/dev/null <<'PY'
import sys
import pymysql
from conveyor.backends.mysql.backend import parse_url
kwargs = parse_url(sys.argv[1])
kwargs["connect_timeout"] = 3
pymysql.connect(**kwargs).close()
PY
}

if [ -n "${CONVEYOR_TEST_MYSQL_URL:-}" ]; then
  if answers "$CONVEYOR_TEST_MYSQL_URL"; then echo "$CONVEYOR_TEST_MYSQL_URL"; exit 0; fi
  say "CONVEYOR_TEST_MYSQL_URL=$CONVEYOR_TEST_MYSQL_URL does not answer"; exit 1
fi

LOCAL=mysql://root@127.0.0.1:3306/mysql
if answers "$LOCAL"; then echo "$LOCAL"; exit 0; fi

if [ -x /usr/sbin/mariadbd ] && command -v start-stop-daemon >/dev/null 2>&1; then
  say "starting the machine's MariaDB (/usr/sbin/mariadbd)"
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd >&2 2>&1 || true
  for _ in $(seq 1 60); do answers "$LOCAL" && { echo "$LOCAL"; exit 0; }; sleep 0.5; done
  say "MariaDB was started but does not answer as root@127.0.0.1:3306 (see its error log)"
  exit 1
fi
say "no MySQL/MariaDB answers as root@127.0.0.1:3306 and /usr/sbin/mariadbd was not found."
say "Install MariaDB 10.6+ or MySQL 8.0+ (e.g. apt-get install mariadb-server), or set"
say "CONVEYOR_TEST_MYSQL_URL=mysql://user:pass@host:3306/db (a user that may create databases)."
exit 1
