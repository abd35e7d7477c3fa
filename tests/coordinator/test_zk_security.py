"""coordinator/zk_security.py against a real ZooKeeper: the ACLs ZkSession puts on what it
creates (parents, transactions, ephemerals), world reads on and off, the topic store under
ACLs, and the checks on bad settings."""
import asyncio
import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from coordinator.layout import ClusterPaths
from coordinator.topics import ZkTopicConfigStore
from coordinator.zk import ZkSession
from coordinator.zk_security import ZkSecurity, ZkSecurityError, parse_auth
from node.topics import TopicConfig

AUTH = "brokers:s3cret-pass"


def _stranger(hosts, auth=""):
    zk = KazooClient(hosts=hosts, timeout=3, auth_data=[("digest", auth)] if auth else None)
    zk.start(timeout=10)
    return zk


@pytest.mark.parametrize("world_read", [True, False])
def test_created_znodes_carry_digest_acl(zk_hosts, world_read):
    gp = ClusterPaths(f"sec{uuid.uuid4().hex[:6]}").group("g1")

    async def main():
        s = ZkSession(zk_hosts, 2.0, security=ZkSecurity(auth=AUTH, world_read=world_read))
        await s.start()
        try:
            await s.create(gp.state, b"{}", makepath=True)          # parents made too
            await s.commit(lambda tx: tx.create(gp.leader, b"{}", ephemeral=True))
            store = ZkTopicConfigStore(s, gp, TopicConfig.from_json)
            await asyncio.to_thread(store.save, {"T": TopicConfig("T", 4, 4)}, {})
            stranger = _stranger(zk_hosts)
            try:
                for path in (gp.base, gp.state, gp.leader, gp.topic("T"), gp.topics):
                    acl, _ = await s.get_acls(path)   # getACL needs READ itself
                    schemes = sorted(a.id.scheme for a in acl)
                    assert schemes == (["digest", "world"] if world_read else ["digest"]), path
                    if world_read:
                        stranger.get(path)
                    else:
                        with pytest.raises(NoAuthError):
                            stranger.get(path)
                    with pytest.raises(NoAuthError):
                        stranger.set(path, b"forged")
                with pytest.raises(NoAuthError):
                    stranger.delete(gp.leader)
                with pytest.raises(NoAuthError):
                    stranger.create(gp.topic("Forged"), b"{}")
            finally:
                stranger.stop()
            friend = _stranger(zk_hosts, AUTH)   # the same identity may (the check bites)
            try:
                friend.set(gp.state, b'{"epoch":0}')
            finally:
                friend.stop()
        finally:
            await s.stop()
    asyncio.run(main())


def test_bad_settings_are_reported():
    with pytest.raises(ZkSecurityError):
        parse_auth("no-colon")
    assert ZkSecurity(auth="u:").problems()
    p = ZkSecurity(tls=True, cert_file="/nope.pem").problems()
    assert any("CA" in x for x in p) and any("together" in x for x in p)
    assert "s3cret" not in repr(ZkSecurity(auth=AUTH))
