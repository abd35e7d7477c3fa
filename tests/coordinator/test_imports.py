"""Each coordinator module imports alone and never imports the broker; the pure ones
(layout, election) need no kazoo."""
import subprocess
import sys

import pytest

PURE = ["coordinator.layout", "coordinator.election",
        "coordinator.zk_security"]   # node/security.py imports it in standalone brokers too
REST = ["coordinator.zk", "coordinator.in_sync", "coordinator.member", "coordinator.replica",
        "coordinator.topics", "coordinator.view", "coordinator.handoff"]


@pytest.mark.parametrize("module", PURE + REST)
def test_module_imports_alone_and_never_imports_node(module):
    code = (f"import sys, {module}; "
            f"bad = [m for m in sys.modules if m == 'node' or m.startswith('node.')]; "
            f"assert not bad, bad; "
            f"assert {module in PURE} is False or 'kazoo' not in sys.modules, 'kazoo'")
    subprocess.run([sys.executable, "-c", code], check=True)
