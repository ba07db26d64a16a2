#!/usr/bin/env bash
# The dashboard tests drive a real Chromium with Playwright, which cannot download
# its own browsers on an offline machine: use Debian's package, installing it when
# it is missing and we may (root with apt-get). Otherwise say how to get one.
set -u
CHROMIUM=${CONVEYOR_TEST_CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROMIUM" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: installing Debian's chromium for the dashboard tests" >&2
  { apt-get update -qq && apt-get install -y -qq chromium; } >&2 && [ -x "$CHROMIUM" ] && exit 0
fi
echo "ensure-chromium: the dashboard tests need Chromium at $CHROMIUM:" \
  "install it (apt-get install chromium) or set CONVEYOR_TEST_CHROMIUM to a Chromium binary" >&2
exit 1
