"""coordinator/zk_security.py against a real ZooKeeper: the ACLs ZkSession puts on what it
creates (parents, transactions, ephemerals), world reads on and off, the topic store under
ACLs, and the checks on bad settings."""
import asyncio
import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from tidemq.coordinator.layout import ClusterPaths
from tidemq.coordinator.topics import ZkTopicConfigStore
from tidemq.coordinator.zk import ZkSession
from tidemq.coordinator.zk_security import ZkSecurity, ZkSecurityError, parse_auth
from tidemq.node.topics import TopicConfig

AUTH = "brokers:s3cret-pass"


def _stranger(hosts, auth=""):
    zk = KazooClient(hosts=hosts, timeout=3, auth_data=[("digest", auth)] if auth else None)
    zk.start(timeout=10)
    return zk


@pytest.mark.parametrize("world_read", [True, False])
def test_created_znodes_carry_digest_acl(zk_hosts, world_read):
    # A root of its own: under the shared /tidemq, a digest ACL on the root would keep the
    # other tests' unauthenticated sessions from creating their clusters.
    gp = ClusterPaths("c1", f"/sec-{uuid.uuid4().hex[:8]}").group("g1")

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


def test_znodes_made_before_credentials_are_tightened(zk_hosts):
    gp = ClusterPaths("c1", f"/old-{uuid.uuid4().hex[:8]}").group("g1")

    async def main():
        open_s = ZkSession(zk_hosts, 2.0)
        await open_s.start()
        secured = ZkSession(zk_hosts, 2.0, security=ZkSecurity(auth=AUTH))
        await secured.start()
        try:
            await open_s.create(gp.state, b"{}", makepath=True)     # world:anyone ALL
            changed = await secured.tighten_acls([gp.base, gp.state, gp.leader])
            assert changed == [gp.base, gp.state]                    # leader does not exist
            assert await secured.tighten_acls([gp.base, gp.state]) == []   # idempotent
            with pytest.raises(NoAuthError):
                await open_s.set(gp.state, b"forged")
            await secured.set(gp.state, b"{}")
        finally:
            await open_s.stop()
            await secured.stop()
    asyncio.run(main())
