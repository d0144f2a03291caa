#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Identity tests need MUNGE (the tests start their own munged with their own keys) and three
# unprivileged users of their own; the unit-file test needs systemd-analyze.
if [ "$(id -u)" = 0 ]; then
  if ! command -v munged >/dev/null || ! ldconfig -p | grep -q libmunge.so.2; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq munge >/dev/null
  fi
  if ! command -v systemd-analyze >/dev/null; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
  fi
  for u in airtest-a airtest-b airtest-op; do
    id "$u" >/dev/null 2>&1 || useradd --no-create-home --shell /bin/sh "$u"
  done
fi
# The tests submit jobs as the user `nobody`, who must be able to run this venv's Python:
# give "others" search (x) permission on the directories above the interpreter, nothing more.
# The same for the tools in .venv/bin and for this checkout.
for start in "$(dirname "$(readlink -f .venv/bin/python)")" "$PWD/.venv/bin"; do
  d=$start
  while [ "$d" != "/" ]; do
    if [ "$(id -u)" = 0 ] && ! su -s /bin/sh nobody -c "test -x '$d'" 2>/dev/null; then chmod o+x "$d"; fi
    d=$(dirname "$d")
  done
done
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
# The whole suite: the modules marked serial (their torch ranks take both cores) one after the other,
# then the rest two modules at a time (pytest-xdist; each module whole in one worker, with its cluster
# on loopback addresses of its own). Both parts run; either failing fails the suite.
trap 'exit 130' INT   # (Ctrl-C ends the suite, not only its first part)
status=0
.venv/bin/python -m pytest -q -m serial || status=$?
.venv/bin/python -m pytest -q -m "not serial" -n 2 --dist loadfile || status=$?
exit "$status"
