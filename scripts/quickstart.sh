#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job: the store benchmark in quick mode.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python bench/store_bench.py --quick
