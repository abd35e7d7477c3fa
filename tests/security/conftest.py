"""Security tests: real brokers with ACL / TLS on, real certificates from `tidemq certs`."""
from __future__ import annotations

import contextlib
import os
import textwrap

import pytest

from tests.support.broker_proc import BrokerProcess, broker, broker_factory  # noqa: F401
from tidemq.node.tools.dev_certs import make_dev_certs

SECRET_ALICE = "alice-secret-Zq9wX4"
SECRET_ADMIN = "admin-secret-Kp3vR7"
ADMIN_TOKEN = "admin-token-Yh5nM2"

ACL_BASE = textwrap.dedent(f"""
    [[accounts]]
    access_key = "alice"
    secret_key = "{SECRET_ALICE}"
    default_topic_perm = "DENY"
    default_group_perm = "SUB"
    topic_perms = {{ AclOrders = "PUB|SUB", AclAudit = "SUB", AclClosed = "DENY" }}

    [[accounts]]
    access_key = "root"
    secret_key = "{SECRET_ADMIN}"
    admin = true

    [[accounts]]
    access_key = "faraway"
    secret_key = "faraway-secret-1"
    allowed_addresses = "10.9.9.0/24"
    default_topic_perm = "PUB|SUB"
    default_group_perm = "SUB"
""")


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    return make_dev_certs(str(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="session")
def other_certs(tmp_path_factory):
    """A second, unrelated CA: its certificates must not be trusted by the first."""
    return make_dev_certs(str(tmp_path_factory.mktemp("other-certs")))


def write_acl(path, text=ACL_BASE) -> str:
    """Write atomically (the broker may reload at any moment) with a fresh mtime."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return str(path)


@contextlib.contextmanager
def acl_broker_running(tmp, text: str):
    """A started broker with ACL on and `text` as its accounts file, stopped (then killed if
    still there) on exit."""
    path = write_acl(tmp / "acl.toml", text)
    b = BrokerProcess(str(tmp / "store"), ("security.acl_enable=true",
                                           f"security.acl_file={path}"))
    try:
        b.start()
        yield b
    finally:
        try:
            b.stop()
        finally:
            b.kill()


def tls_settings(certs) -> tuple:
    return ("security.tls_enable=true", f"security.tls_cert_file={certs['server_cert']}",
            f"security.tls_key_file={certs['server_key']}",
            f"security.tls_ca_file={certs['ca_cert']}")
