"""Session-wide fixtures shared by every test package."""
from __future__ import annotations

import inspect
import logging
import os
import re
import subprocess

import pytest

from tests.support.zookeeper import ZkCluster, debian_zookeeper_available, docker_available


@pytest.fixture(scope="session")
def zk_hosts():
    """A real ZooKeeper: ZK_HOSTS if set; else a testcontainers container where a Docker
    engine answers (unless ZK_BACKEND=local); else Debian's zookeeper package as a process.
    Missing everything fails under CI (a missing install step must not become a skip)."""
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    if os.environ.get("ZK_HOSTS"):
        yield os.environ["ZK_HOSTS"]
        return
    if os.environ.get("ZK_BACKEND") != "local" and docker_available():
        from testcontainers.core.container import DockerContainer
        with DockerContainer("zookeeper:3.8").with_exposed_ports(2181) as c:
            yield f"{c.get_container_host_ip()}:{c.get_exposed_port(2181)}"
        return
    if debian_zookeeper_available():
        cluster = ZkCluster(1).start()
        try:
            yield cluster.hosts
        finally:
            cluster.stop()
        return
    if os.environ.get("CI"):
        pytest.fail("no ZooKeeper: install the Debian package `zookeeper` (scripts/setup.sh does)")
    pytest.skip("no ZooKeeper available")


@pytest.fixture
def zk_ensemble():
    """A fresh 3-node ensemble on 127.0.0.1 with kill/restart access to its nodes."""
    if not debian_zookeeper_available():
        if os.environ.get("CI"):
            pytest.fail("no ZooKeeper: install the Debian package `zookeeper`")
        pytest.skip("Debian zookeeper package not installed")
    cluster = ZkCluster(3).start()
    try:
        yield cluster
    finally:
        cluster.stop()


# --- Layers: each test is marked by what it starts, so `-m "not process"` is the fast layer. ---
# A module is marked by what its source (or the fixtures it uses) mentions; a test that starts
# a process without its module being marked fails (the guard below), so the fast layer never
# silently grows slow. zookeeper and spark tests start processes too (java).
_LAYER_PATTERNS = {
    "spark": re.compile(r"\bspark\b|pyspark"),
    "zookeeper": re.compile(r"\bzk_hosts\b|\bzk_ensemble\b|\bZkCluster\b|\bzk_cluster\b"),
    "process": re.compile(r"\bBrokerProcess\b|\bNameServerProcess\b|\bsubprocess\b|\bPopen\b"
                          r"|\bbroker_proc\b|\bnamesrv_proc\b|\bshared_broker\b|\bcluster\b"),
}
_PROCESS_LAYERS = frozenset(_LAYER_PATTERNS)
_source_cache: dict[str, str] = {}


def _text(path) -> str:
    key = str(path)
    if key not in _source_cache:
        try:
            with open(key, encoding="utf-8") as fh:
                _source_cache[key] = fh.read()
        except OSError:
            _source_cache[key] = ""
    return _source_cache[key]


def _fixture_sources(item) -> str:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return ""
    out = []
    for name, defs in info.name2fixturedefs.items():
        if name == "_fast_layer_starts_no_process":
            continue
        for d in defs:
            try:
                out.append(inspect.getsource(d.func))
            except (OSError, TypeError):
                pass
    return "\n".join(out)


def pytest_collection_modifyitems(config, items):
    for item in items:
        text = _text(item.fspath) + _fixture_sources(item)
        layers = {name for name, rx in _LAYER_PATTERNS.items() if rx.search(text)}
        if layers & {"spark", "zookeeper"}:
            layers.add("process")
        for name in sorted(layers):
            if item.get_closest_marker(name) is None:
                item.add_marker(getattr(pytest.mark, name))


@pytest.fixture(autouse=True)
def _fast_layer_starts_no_process(request, monkeypatch):
    """A test outside the process layers must not start a process."""
    if any(request.node.get_closest_marker(m) for m in _PROCESS_LAYERS):
        yield
        return
    real_init = subprocess.Popen.__init__

    def refuse(self, *args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a process but is not marked "
                             "`process` (add `pytestmark = pytest.mark.process`)")
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    try:
        yield
    finally:
        monkeypatch.setattr(subprocess.Popen, "__init__", real_init)
