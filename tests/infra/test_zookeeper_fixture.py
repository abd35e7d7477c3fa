"""The real ZooKeeper the cluster tests stand on: sessions, ephemerals, ensemble failover."""
import time

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from kazoo.retry import KazooRetry

from tests.support.zookeeper import serving_mode


def _client(hosts, timeout=2.0):
    c = KazooClient(hosts=hosts, timeout=timeout,
                    connection_retry=KazooRetry(max_tries=-1, max_delay=1.0))
    c.start(timeout=10)
    return c


def test_ephemeral_node_lives_and_dies_with_its_session(zk_hosts):
    a, b = _client(zk_hosts), _client(zk_hosts)
    try:
        a.create("/tidemq-test/member", b"a", ephemeral=True, makepath=True)
        assert b.get("/tidemq-test/member")[0] == b"a"
        assert a._session_timeout == 2000  # minSessionTimeout 1000: 2 s is not raised to 4 s
        a.stop()
        deadline = time.monotonic() + 5
        while b.exists("/tidemq-test/member") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b.exists("/tidemq-test/member") is None
    finally:
        a.stop()
        b.stop()


def test_ensemble_survives_losing_its_leader(zk_ensemble):
    c = _client(zk_ensemble.hosts, timeout=4.0)
    try:
        c.create("/tidemq-test/x", b"1", makepath=True)
        session = c.client_id[0]
        leader = zk_ensemble.leader()
        assert serving_mode(leader.client_port) == "leader"
        leader.kill()
        others = [n for n in zk_ensemble.nodes if n is not leader]
        zk_ensemble.wait_serving(20, others)
        # The client reconnects to a survivor on its own time (a loaded machine may take a
        # few seconds): until then a call fails with ConnectionLoss, after it the session is
        # the same one.
        deadline = time.monotonic() + 20
        while True:
            try:
                c.set("/tidemq-test/x", b"2")
                break
            except ConnectionLoss:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert c.client_id[0] == session
        assert c.get("/tidemq-test/x")[0] == b"2"
    finally:
        c.stop()
