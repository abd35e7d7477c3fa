#!/usr/bin/env bash
# The main job: a lean set-up (scripts/setup.sh --lean: .venv with the broker's three Python
# packages; no root, no apt, no Java), then a standalone broker (no ZooKeeper) on a temporary
# development store, a producer and a consumer through the `tidemq` CLI with their figures
# printed as JSON lines; the broker is stopped and its store removed at the end.
#   bash scripts/quickstart.sh [COUNT]     (default 100000 messages of 1 KiB)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --lean
exec bash scripts/cli_demo.sh "$@"
