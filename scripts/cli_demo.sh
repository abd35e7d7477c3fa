#!/usr/bin/env bash
# The CLI end to end: start a standalone broker with the development profile (`--dev`: a
# temporary store with small files, removed when it stops), create a topic, produce and consume
# a batch of messages with `tidemq`, print the figures (JSON lines), stop the broker.
#   bash scripts/cli_demo.sh [COUNT]      (default 100000 messages of 1 KiB)
# Exits non-zero when a send was not acknowledged or fewer messages than sent were received.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-100000}
TIDEMQ=.venv/bin/tidemq
dir=$(mktemp -d -t tidemq-demo-XXXXXX)
fifo="$dir/ready"
mkfifo "$fifo"
"$TIDEMQ" broker --dev --set listen_port=0 --set admin_port=0 --log-level WARNING \
  >"$fifo" 2>"$dir/broker.log" &
broker_pid=$!
cleanup() { kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
read -r -t 60 ready <"$fifo" || { echo "broker did not start:" >&2; cat "$dir/broker.log" >&2; exit 1; }
addr=$(sed -n 's/.*remoting=\([^ ]*\).*/\1/p' <<<"$ready")
echo "broker at $addr" >&2
"$TIDEMQ" -b "$addr" -o json topic create Demo --queues 8
"$TIDEMQ" -b "$addr" -o json produce Demo --count "$COUNT" --size 1024 --batch 64
"$TIDEMQ" -b "$addr" -o json produce Demo --count 20000 --size 1024 --tag single
"$TIDEMQ" -b "$addr" -o json consume Demo demo-group --from-beginning --count "$((COUNT + 20000))" --timeout 120
"$TIDEMQ" -b "$addr" -o json topic stats Demo
