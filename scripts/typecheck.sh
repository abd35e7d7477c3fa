#!/usr/bin/env bash
# Type-check the installed package layout: the folders install under one name, `tidemq`
# (setup.py maps client/ to tidemq, node/ to tidemq.node, ...), so mypy reads them through a
# temporary tree of symlinks shaped like the installed package. Settings: pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
case "$PY" in /*) ;; */*) PY="$PWD/$PY" ;; esac   # the check runs from a temporary directory
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/tidemq"
for entry in client/*; do
  ln -s "$PWD/$entry" "$tree/tidemq/$(basename "$entry")"
done
for pkg in node ha coordinator pipeline; do
  ln -s "$PWD/$pkg" "$tree/tidemq/$pkg"
done
cd "$tree"
"$PY" -m mypy --config-file "$OLDPWD/pyproject.toml" -p tidemq "$@"
