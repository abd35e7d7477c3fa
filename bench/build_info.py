"""What every benchmark prints about the build it measured: `compiled` is True when the C
accelerators (client/protocol/_speedups.c) were in use, False on the pure-Python path
(not built, or TIDEMQ_PURE_PYTHON=1); `compiled_dedup_table` likewise for the duplicate
window's key table (node/sending/_dedup_table.c). Brokers a benchmark starts inherit the same
choice."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tidemq.node.sending import dedup_keys  # noqa: E402
from tidemq.protocol import accel  # noqa: E402


def build_fields() -> dict:
    return {"compiled": accel.COMPILED, "compiled_dedup_table": dedup_keys.COMPILED}
