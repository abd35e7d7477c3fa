"""Session-wide fixtures shared by every test package."""
from __future__ import annotations

import logging
import os

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
