#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite except the `slow` soak suites.
# pytest's exit code 5 ("no tests collected") is turned into a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
.venv/bin/python -m pytest -m "not slow" -q "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "test.sh: no tests ran" >&2
  exit 1
fi
exit $rc
