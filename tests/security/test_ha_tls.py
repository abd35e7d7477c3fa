"""Replication over mutual TLS between real broker processes: an SDK producer over TLS writes to
the master, the slave copies it; a slave without a client certificate, or with one from another
CA, is refused by the master and copies nothing."""
import asyncio
import time

from tests.ha.test_broker_replication import in_sync, max_offset, metrics, wait_for
from tests.security.conftest import tls_settings
from tests.support.broker_proc import ha_group
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.security import ClientSecurity


def _ha_tls(certs, with_cert=True):
    base = ("security.ha_tls_enable=true", f"security.tls_ca_file={certs['ca_cert']}")
    if not with_cert:
        return base
    return base + (f"security.tls_cert_file={certs['server_cert']}",
                   f"security.tls_key_file={certs['server_key']}")


def test_sdk_and_replication_over_tls(broker_factory, tmp_path, certs):
    master, (slave,) = ha_group(broker_factory, tmp_path,
                                master_extra=_ha_tls(certs) + tls_settings(certs)[:1],
                                slave_extra=_ha_tls(certs))
    wait_for(lambda: in_sync(master), what="slave in sync over TLS")

    async def produce():
        sec = ClientSecurity(tls_ca_file=certs["ca_cert"])
        async with Producer("ha-tls", master.addr, security=sec) as p:
            return [await p.send(Message("HaTls", b"r-%d" % i)) for i in range(50)]

    assert all(r.ok for r in asyncio.run(produce()))  # SYNC_MASTER: acked once the slave holds it
    end = max_offset(master)
    wait_for(lambda: max_offset(slave) == end, what="slave caught up")


def test_slave_without_or_with_foreign_certificate_is_refused(broker_factory, tmp_path, certs,
                                                              other_certs):
    master, (bare, foreign) = ha_group(
        broker_factory, tmp_path, slaves=2, master_extra=_ha_tls(certs),
        slave_extra=(), start_slaves=False)
    bare.settings += list(_ha_tls(certs, with_cert=False))
    foreign.settings += ["security.ha_tls_enable=true", f"security.tls_ca_file={certs['ca_cert']}",
                         f"security.tls_cert_file={other_certs['server_cert']}",
                         f"security.tls_key_file={other_certs['server_key']}"]
    bare.start()
    foreign.start()
    time.sleep(3)
    assert metrics(master).get("tidemq_ha_in_sync_replicas", 0) <= 1
    assert max_offset(bare) == 0 and max_offset(foreign) == 0
    assert master.alive and bare.alive and foreign.alive
