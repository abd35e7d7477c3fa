"""Which package may import which: one table, checked on every module's source.

Dependencies point one way: the wire protocol imports nothing of ours; the SDK never needs the
server; replication (ha) and coordination never import the broker; the pipeline needs only the
SDK; each third-party library stays in its room (kazoo in the coordinator, aiohttp and
prometheus_client in the broker's operations and name-server packages, grpcio and protobuf in
the gRPC service, pyspark and pyarrow in the pipeline). Imports inside functions ("lazy") are
allowed a little more: the command line starts servers, so it may import them when a server
command runs, and the broker imports its gRPC service only when it is enabled.

A second check imports every module alone in a fresh interpreter: no cycles, and an SDK
module really loads none of the server's packages.
"""
from __future__ import annotations

import ast
import concurrent.futures
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = {"client": "tidemq", "node": "tidemq.node", "ha": "tidemq.ha",
           "coordinator": "tidemq.coordinator", "pipeline": "tidemq.pipeline"}
SDK = "tidemq"  # the SDK: every tidemq module outside the areas below

# area -> (first-party areas it may import, extra areas allowed lazily, third-party roots)
RULES: dict[str, tuple[set[str], set[str], set[str]]] = {
    "tidemq.protocol": ({"tidemq.protocol"}, set(), {"orjson"}),
    SDK: ({SDK, "tidemq.protocol"}, set(), {"orjson"}),
    "tidemq.cli": ({SDK, "tidemq.protocol", "tidemq.cli"},
                   {"tidemq.node", "tidemq.node.namesrv", "tidemq.coordinator"}, set()),
    "tidemq.ha": ({"tidemq.ha", "tidemq.protocol"}, set(), set()),
    "tidemq.coordinator": ({"tidemq.coordinator", "tidemq.ha", "tidemq.protocol"}, set(),
                           {"kazoo"}),
    "tidemq.pipeline": ({"tidemq.pipeline", SDK, "tidemq.protocol"}, set(),
                        {"pyspark", "pyarrow"}),
    # the gRPC service needs the `grpc` extra: the broker imports it only when it is enabled
    "tidemq.node": ({"tidemq.node", "tidemq.node.ops", SDK, "tidemq.protocol", "tidemq.ha",
                     "tidemq.coordinator"}, {"tidemq.node.grpc"}, {"orjson"}),
    "tidemq.node.ops": ({"tidemq.node", "tidemq.node.ops", SDK, "tidemq.protocol",
                         "tidemq.ha", "tidemq.coordinator"}, set(),
                        {"aiohttp", "prometheus_client"}),
    "tidemq.node.grpc": ({"tidemq.node", "tidemq.node.ops", "tidemq.node.grpc", SDK,
                          "tidemq.protocol"}, set(), {"grpc", "google"}),
    "tidemq.node.namesrv": ({"tidemq.node", "tidemq.node.ops", "tidemq.node.namesrv", SDK,
                             "tidemq.protocol", "tidemq.coordinator"}, set(),
                            {"aiohttp", "prometheus_client"}),
}
# Pure modules: no asyncio, no I/O library; fed values, returning values.
PURE = {"tidemq.ha.epochs", "tidemq.ha.protocol", "tidemq.ha.actions", "tidemq.ha.config",
        "tidemq.ha.in_sync", "tidemq.ha.master_session", "tidemq.ha.master_group",
        "tidemq.ha.slave_session", "tidemq.coordinator.layout", "tidemq.coordinator.election",
        "tidemq.consumer.rebalance", "tidemq.protocol.codes", "tidemq.protocol.record",
        "tidemq.protocol.remoting"}
_AREAS = sorted((a for a in RULES if a != SDK), key=len, reverse=True)


def area_of(module: str) -> str:
    for a in _AREAS:
        if module == a or module.startswith(a + "."):
            return a
    return SDK


def modules() -> dict[str, str]:
    """dotted module name -> file path, for every first-party module."""
    out = {}
    for folder, name in FOLDERS.items():
        for dirpath, _dirs, files in os.walk(os.path.join(REPO, folder)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), os.path.join(REPO, folder))
                parts = rel[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                out[".".join([name, *parts])] = os.path.join(dirpath, f)
    return out


def imports_of(path: str):
    """(imported module, lazy?) for every absolute import in a file."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    top = {id(n) for n in tree.body}
    top |= {id(n) for stmt in tree.body if isinstance(stmt, (ast.If, ast.Try))
            for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            yield name, id(node) not in top


def test_the_table_covers_every_first_party_module():
    found = modules()
    assert "tidemq.node.broker" in found and "tidemq.producer.producer" in found
    assert PURE <= set(found), PURE - set(found)


@pytest.mark.parametrize("module", sorted(modules()))
def test_module_imports_only_what_its_area_may(module):
    path = modules()[module]
    allowed, lazy_extra, third = RULES[area_of(module)]
    problems = []
    for name, lazy in imports_of(path):
        root = name.split(".")[0]
        if name == "__future__" or (root in sys.stdlib_module_names and root != "tidemq"):
            if module in PURE and root == "asyncio":
                problems.append(f"{name}: a pure module never needs asyncio")
            continue
        if root == "tidemq":
            target = area_of(name)
            if target in allowed or (lazy and target in lazy_extra):
                continue
            problems.append(f"{name} ({'lazy' if lazy else 'module level'}): "
                            f"{area_of(module)} may not import {target}")
        elif root not in third:
            problems.append(f"{name}: third-party library outside its room")
    assert not problems, problems


SDK_MODULES = sorted(m for m in modules() if area_of(m) in (SDK, "tidemq.protocol", "tidemq.cli")
                     and not m.endswith("__main__"))
SERVER = ("tidemq.node", "tidemq.ha", "tidemq.coordinator", "tidemq.pipeline", "aiohttp",
          "prometheus_client", "kazoo", "pyspark")


@pytest.mark.parametrize("module", SDK_MODULES)
def test_sdk_module_imports_alone_without_the_server(module):
    code = (f"import sys, {module}\n"
            f"bad = [m for m in sys.modules if m.startswith({SERVER!r})]\n"
            f"assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_every_server_module_imports_alone():
    """Each in a fresh interpreter (two at a time): an import cycle shows up only when the
    module that closes it is imported first."""
    names = sorted(m for m in modules() if area_of(m) not in (SDK, "tidemq.protocol",
                                                               "tidemq.cli", "tidemq.pipeline")
                   and not m.endswith("__main__"))

    def load(name):
        return name, subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True,
                                    text=True, cwd=REPO, timeout=120)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        failed = {n: p.stderr[-500:] for n, p in pool.map(load, names) if p.returncode}
    assert not failed, failed
