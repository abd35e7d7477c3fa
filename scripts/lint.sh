#!/usr/bin/env bash
# Lint and type checks, as CI runs them before the tests (.ci/run): ruff over the whole tree,
# mypy over the installed package layout (scripts/typecheck.sh). Settings live in pyproject.toml.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
rc=0
"$PY" -m ruff check . || rc=1
PYTHON="$PY" bash scripts/typecheck.sh || rc=1
exit $rc
