#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job: a standalone broker (no ZooKeeper) on a
# temporary store, a producer and a consumer through the `tidemq` CLI, with their figures
# printed as JSON lines; the broker is stopped at the end.
#   bash scripts/quickstart.sh [COUNT]     (default 100000 messages of 1 KiB)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec bash scripts/cli_demo.sh "$@"
