"""Every SDK module imports alone, with the standard library only (Spark workers import the
SDK without the server's dependencies), in a fresh interpreter each."""
import os
import pkgutil
import subprocess
import sys

import pytest

import client

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = sorted(f"client.{m.name}" for m in pkgutil.iter_modules(client.__path__) if not m.ispkg)
FORBIDDEN = ("node", "ha", "coordinator", "aiohttp", "prometheus_client", "kazoo", "pyspark")


def test_every_module_is_listed():
    assert {"client.producer", "client.consumer", "client.rebalance", "client.cli"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone_without_server_dependencies(module):
    code = (f"import sys, {module}\n"
            f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}]\n"
            f"assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
