#!/usr/bin/env bash
# The backend contract suite (tests/backend) on MariaDB again, through the optional
# C driver (driver=mysqlclient in the URL): the same behaviour by either driver.
# Needs CONVEYOR_TEST_MYSQL_URL (`make test` sets it) and PYTHON (the suite's venv).
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
PYTHON="$PYTHON" bash scripts/ensure-mysqlclient.sh
url=$CONVEYOR_TEST_MYSQL_URL
case "$url" in *\?*) url="$url&driver=mysqlclient" ;; *) url="$url?driver=mysqlclient" ;; esac
echo "---- tests/backend on MariaDB through mysqlclient"
CONVEYOR_TEST_MYSQL_URL=$url CONVEYOR_TEST_DATABASES=mysql \
  "$PYTHON" -m pytest -n "${TEST_WORKERS:-2}" "$@" tests/backend
