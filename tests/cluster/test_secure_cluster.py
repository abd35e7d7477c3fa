"""Cluster mode with security on everywhere, all real processes: a ZooKeeper serving TLS only to
certificate holders (Debian's package, Netty, secureClientPort), TideMQ's znodes under digest
ACLs, brokers with ACL + TLS on remoting and mutual TLS on HA, name servers over TLS (reading
ZooKeeper with the credential, since world reads are off), an SDK producer with credentials
through the name server, and a SIGKILL of the master: sends continue, nothing acknowledged lost.
A ZooKeeper client without the credential can neither read nor change the group's state."""
import asyncio
import os
import textwrap
import time
import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from tests.support.cluster import ClusterHarness, produce
from tests.support.history import History
from tests.support.namesrv_proc import NameServerProcess
from tests.support.zookeeper import ZkCluster, debian_zookeeper_available
from tidemq.acl_signing import Credentials
from tidemq.admin import Admin
from tidemq.consumer.broker_calls import PullStatus
from tidemq.consumer.pull import PullConsumer
from tidemq.coordinator.layout import ClusterPaths, GroupState
from tidemq.node.tools.dev_certs import make_dev_certs
from tidemq.producer.producer import Producer
from tidemq.security import ClientSecurity
from tidemq.tls import client_context

ZK_AUTH = "tidemq:zk-pass-Wq81"
APP = Credentials("app", "app-secret-Lm27")
ROOT = Credentials("root", "root-secret-Vb64")
TOPIC = "SecureOrders"
BOUND_S = 30.0   # generous: bench/failover_bench.py measures the real figure

pytestmark = pytest.mark.skipif(not debian_zookeeper_available() and not os.environ.get("CI"),
                                reason="needs Debian's zookeeper package")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_dev_certs(str(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="module")
def tls_zk(certs):
    zk = ZkCluster(1, tls=certs).start()
    yield zk
    zk.stop()


def _secure_harness(tls_zk, certs, tmp_path, groups) -> ClusterHarness:
    acl = tmp_path / "acl.toml"
    acl.write_text(textwrap.dedent(f"""
        [[accounts]]
        access_key = "{APP.access_key}"
        secret_key = "{APP.secret_key}"
        default_topic_perm = "PUB|SUB"
        default_group_perm = "SUB"

        [[accounts]]
        access_key = "{ROOT.access_key}"
        secret_key = "{ROOT.secret_key}"
        admin = true
    """))
    auth = tmp_path / "zk-auth"
    auth.write_text(ZK_AUTH + "\n")
    os.chmod(auth, 0o600)
    settings = ["security.acl_enable=true", f"security.acl_file={acl}",
                "security.tls_enable=true", "security.ha_tls_enable=true",
                f"security.tls_cert_file={certs['server_cert']}",
                f"security.tls_key_file={certs['server_key']}",
                f"security.tls_ca_file={certs['ca_cert']}",
                "zookeeper.tls_enable=true",           # CA and client cert: the security.* ones
                f"zookeeper.auth_file={auth}", "zookeeper.acl_world_read=false"]
    h = ClusterHarness(tls_zk.secure_hosts, tmp_path, groups, settings=settings)
    for ns in h.namesrvs:
        ns.cmd += ["--tls-cert", certs["server_cert"], "--tls-key", certs["server_key"],
                   "--zk-tls-ca", certs["ca_cert"], "--zk-tls-cert", certs["client_cert"],
                   "--zk-tls-key", certs["client_key"], "--zk-auth-file", str(auth)]
    h.http_context = client_context(certs["ca_cert"])
    h.start()
    for ns in h.namesrvs:
        ns.http_url = ns.http_url.replace("http://", "https://")
    return h


def _bare_client(hosts: str, auth: str = "") -> KazooClient:
    zk = KazooClient(hosts=hosts, timeout=3, auth_data=[("digest", auth)] if auth else None)
    zk.start(timeout=15)
    return zk


def _assert_znodes_protected(h, tls_zk) -> None:
    """Through the plaintext probe port (ACLs hold whatever the transport): without the
    credential nothing of the group can be read or changed; with it, it can (the check bites)."""
    gp = ClusterPaths(h.cluster).group("g1")
    owner = _bare_client(tls_zk.hosts, ZK_AUTH)
    stranger = _bare_client(tls_zk.hosts)
    try:
        data, _ = owner.get(gp.state)
        state = GroupState.decode(data)
        assert state.epoch >= 1 and state.master and len(state.in_sync) == 3
        acl, _ = owner.get_acls(gp.state)
        assert [a.id.scheme for a in acl] == ["digest"], acl
        forged = state.replace(epoch=state.epoch + 100, in_sync=[state.master]).encode()
        attacks = [lambda: stranger.get(gp.state),
                   lambda: stranger.set(gp.state, forged),                 # epoch / in-sync set
                   lambda: stranger.delete(gp.leader),                     # force an election
                   lambda: stranger.create(gp.handoff, b'{"to":"g1-2"}'),  # steal the role
                   lambda: stranger.create(gp.member("intruder"), b"{}", ephemeral=True),
                   lambda: stranger.create(gp.topic("Forged"), b"{}"),
                   lambda: stranger.create(ClusterPaths(h.cluster).groups + "/evil", b"")]
        for attack in attacks:
            with pytest.raises(NoAuthError):
                attack()
        assert GroupState.decode(owner.get(gp.state)[0]) == state   # nothing changed
        leader_acl, _ = owner.get_acls(gp.leader)                   # ephemerals too
        assert [a.id.scheme for a in leader_acl] == ["digest"]
    finally:
        stranger.stop()
        owner.stop()


async def _read_all(h, security, history, timeout_s=60.0) -> None:
    consumer = PullConsumer(f"checker-{uuid.uuid4().hex[:6]}", h.namesrv_addr, security=security)
    await consumer.start()
    deadline = time.monotonic() + timeout_s
    try:
        for mq in await consumer.fetch_queues(TOPIC):
            offset, end = await consumer.min_offset(mq), await consumer.max_offset(mq)
            while offset < end and time.monotonic() < deadline:
                r = await consumer.pull(mq, offset, 64)
                for m in r.messages:
                    history.consume(m.body.decode(), (mq.broker_name, mq.queue_id), m.queue_offset)
                if r.status != PullStatus.FOUND or r.next_begin_offset <= offset:
                    break
                offset = r.next_begin_offset
    finally:
        await consumer.shutdown()


def test_secure_cluster_fails_over_without_losing_acknowledged_sends(tls_zk, certs, tmp_path):
    h = _secure_harness(tls_zk, certs, tmp_path, {"g1": 3})
    app = ClientSecurity(credentials=APP, tls_ca_file=certs["ca_cert"])
    try:
        h.wait_masters()
        h.wait_in_sync("g1", 3)
        _assert_znodes_protected(h, tls_zk)
        # World reads are off: a name server without the credential refuses to start, clearly.
        blind = NameServerProcess(tls_zk.secure_hosts, h.cluster, str(tmp_path / "blind.log"))
        blind.cmd += ["--zk-tls-ca", certs["ca_cert"], "--zk-tls-cert", certs["client_cert"],
                      "--zk-tls-key", certs["client_key"]]
        with pytest.raises(RuntimeError, match="NoAuth"):
            blind.start()

        async def main():
            _, master = h.wait_master("g1")
            async with Admin(master.addr, security=ClientSecurity(
                    credentials=ROOT, tls_ca_file=certs["ca_cert"])) as admin:
                await admin.create_topic(TOPIC, 4)
            history, acks, stop = History(), [], asyncio.Event()
            producer = await Producer("spg", h.namesrv_addr, security=app).start()
            load = asyncio.ensure_future(produce(producer, TOPIC, history, stop=stop,
                                                 prefix="s", tasks=3, acked_log=acks))
            try:
                await asyncio.sleep(2.0)
                assert acks, "no SEND_OK before the kill"
                old, proc = h.master("g1")
                proc.kill()
                killed_at = time.monotonic()
                await asyncio.to_thread(h.wait_master, "g1", old, BOUND_S)
                deadline = time.monotonic() + BOUND_S
                while not any(t > killed_at for t, _ in acks):
                    assert time.monotonic() < deadline, "no SEND_OK after the failover"
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.0)
            finally:
                stop.set()
                await load
                await producer.shutdown()
            await _read_all(h, app, history)
            report = history.assert_valid()
            counts = history.counts()
            assert counts.get("ok", 0) > 100 and not report["lost"], (counts, report)

        asyncio.run(main())
    finally:
        h.stop()
    # Secrets stay out of every log of the run.
    logs = h.logs() + "".join(ns.log_text() for ns in h.namesrvs)
    for secret in (ZK_AUTH.split(":")[1], APP.secret_key, ROOT.secret_key):
        assert secret not in logs


def test_zookeeper_tls_port_refuses_plaintext_and_certless_clients(tls_zk, certs):
    """The broker's settings above reach ZooKeeper only through this port: a plaintext client
    and a TLS client without a certificate get no session; one with a certificate does."""
    hosts = tls_zk.secure_hosts
    for kw in ({}, {"use_ssl": True, "ca": certs["ca_cert"]}):
        zk = KazooClient(hosts=hosts, timeout=2, **kw)
        with pytest.raises(Exception):  # noqa: B017 (kazoo's error differs by TLS failure)
            zk.start(timeout=3)
        zk.stop()
        zk.close()
    zk = KazooClient(hosts=hosts, timeout=2, use_ssl=True, ca=certs["ca_cert"],
                     certfile=certs["client_cert"], keyfile=certs["client_key"],
                     check_hostname=True)
    zk.start(timeout=10)
    try:
        assert zk.exists("/zookeeper") is not None
    finally:
        zk.stop()
        zk.close()


def test_cluster_member_with_ha_tls_but_no_certificate_refuses_to_start(tmp_path, certs):
    """Any cluster member may be promoted and must then serve HA over TLS:
    the process exits with a clear config error and creates nothing."""
    import subprocess
    import sys

    from tests.support.broker_proc import REPO_ROOT
    root = tmp_path / "store"
    env = dict(os.environ, TIDEMQ_HA_SECRET="tidemq-test-ha-secret-0123456789",
               PYTHONPATH=REPO_ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "tidemq.node", "--set", "zookeeper.hosts=127.0.0.1:1",
         "--set", "ha.role=cluster", "--set", "security.ha_tls_enable=true",
         "--set", f"security.tls_ca_file={certs['ca_cert']}", "--set", f"store.root_dir={root}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "any member may be promoted" in proc.stderr
    assert not root.exists()
