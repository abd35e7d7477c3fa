#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite except the `slow` soak suites, then
# the codec, protocol and store tests once more on the pure-Python path.
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
[ $rc -eq 0 ] || exit $rc
# The codec, protocol, store and duplicate-window tests again on the pure-Python twins of the
# compiled accelerators (byte-identical behaviour is the contract; the run above used the C ones).
if [ $# -eq 0 ]; then
  TIDEMQ_PURE_PYTHON=1 .venv/bin/python -m pytest -m "not slow" -q \
    tests/unit tests/store tests/client/test_send_codec.py tests/client/test_message.py \
    tests/client/test_remoting_client.py tests/broker/test_send.py \
    tests/broker/test_batch_limits.py tests/broker/test_units.py tests/broker/test_bad_input.py \
    tests/broker/test_dedup.py
  rc=$?
fi
exit $rc
