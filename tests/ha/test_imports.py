"""Each ha module imports alone; the pure ones pull in neither asyncio nor the broker."""
import subprocess
import sys

import pytest

PURE = ["ha.epochs", "ha.protocol", "ha.actions", "ha.config", "ha.in_sync",
        "ha.master_session", "ha.master_group", "ha.slave_session"]


@pytest.mark.parametrize("module", PURE + ["ha.transport", "ha.service"])
def test_module_imports_alone_and_never_imports_node(module):
    code = (f"import sys, {module}; "
            f"bad = [m for m in sys.modules if m == 'node' or m.startswith('node.')]; "
            f"assert not bad, bad; "
            f"assert {module in PURE} is False or 'asyncio' not in sys.modules, 'asyncio'")
    subprocess.run([sys.executable, "-c", code], check=True)
