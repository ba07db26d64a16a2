#!/usr/bin/env bash
# The Django integration tests (tests/django): a real Django project on SQLite,
# PostgreSQL and MariaDB, in a virtualenv of its own (.venv-django) because Django 6
# needs Python 3.12+ while the main suite runs on the project's floor, 3.11.
# Needs CONVEYOR_TEST_POSTGRES_URL and CONVEYOR_TEST_MYSQL_URL (`make test` sets them).
# Skips, saying so, when no Python 3.12+ is found.
set -u
cd "$(dirname "$0")/.."
say() { echo "test-django: $*" >&2; }
VENV=${DJANGO_VENV:-.venv-django}

find_python() {
  for py in "${DJANGO_PYTHON:-}" python3.12 python3.13 python3.14 \
            /root/.pyenv/versions/3.12*/bin/python /root/.pyenv/versions/3.13*/bin/python; do
    [ -n "$py" ] || continue
    command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || continue
    "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo "$py"; return; }
  done
}

if [ ! -f "$VENV/.installed" ] || [ pyproject.toml -nt "$VENV/.installed" ] \
   || [ scripts/test-django.sh -nt "$VENV/.installed" ] \
   || [ scripts/ensure-mysqlclient.sh -nt "$VENV/.installed" ]; then
  PY=$(find_python)
  if [ -z "$PY" ]; then
    say "SKIPPED: no Python 3.12+ found (Django 6 needs one); set DJANGO_PYTHON to one"
    exit 0
  fi
  say "making $VENV with $PY"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" || exit 1
  "$VENV/bin/python" -m pip install -q --upgrade pip || exit 1
  # Django's MySQL driver, mysqlclient
  PYTHON="$VENV/bin/python" bash scripts/ensure-mysqlclient.sh || exit 1
  "$VENV/bin/python" -m pip install -q -e . "django>=6.1,<6.2" "mysqlclient>=2.2" \
    "pytest>=8" "pytest-timeout>=2.3" || exit 1
  touch "$VENV/.installed"
fi

# One run per database, side by side: they wait on worker processes far more
# than they compute.
logs=$(mktemp -d)
for db in sqlite postgres mysql; do
  # each its own temporary directory: three sessions cleaning up pytest's shared
  # /tmp/pytest-of-<user> at once raced (a directory another was emptying), and
  # the warning that raised is an error here
  (cd tests/django && DJANGO_TEST_DB=$db "../../$VENV/bin/python" -m pytest -c pytest.ini \
     --rootdir . --basetemp "$logs/$db.tmp" -q "$@" >"$logs/$db.log" 2>&1; echo $? >"$logs/$db.rc") &
done
wait
status=0
for db in sqlite postgres mysql; do
  echo "---- Django tests on $db"
  cat "$logs/$db.log"
  [ "$(cat "$logs/$db.rc")" = 0 ] || status=1
done
rm -rf "$logs"
exit $status
