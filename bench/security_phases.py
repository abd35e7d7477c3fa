"""Security phases of bench/e2e_bench.py: what TLS and ACL signature checks cost on the send path.

  - tls_batch_send_msgs_s: the batch-send phase against a broker with TLS on its remoting port
    (compare with batch_send_msgs_s)
  - acl_async_send_msgs_s: the async-send phase (256 in flight) with every request signed by
    the SDK and checked by the broker (compare with async_send_async_flush_msgs_s)
Each uses its own ASYNC_FLUSH broker, started here with a development CA (node/tools/dev_certs.py).
"""
from __future__ import annotations

import asyncio
import os

from tests.support.broker_proc import BrokerProcess
from tidemq.acl_signing import Credentials
from tidemq.admin import Admin
from tidemq.node.tools.dev_certs import make_dev_certs
from tidemq.producer.producer import Producer
from tidemq.security import ClientSecurity

_SECRET = "bench-secret-0123456789"


def _acl_file(path: str) -> str:
    with open(path, "w") as f:
        f.write(f'[[accounts]]\naccess_key = "bench"\nsecret_key = "{_SECRET}"\nadmin = true\n'
                'default_topic_perm = "PUB|SUB"\ndefault_group_perm = "SUB"\n')
    os.chmod(path, 0o600)
    return path


async def _phase(addr, header, security, topic, run):
    async with Admin(addr, header_format=header, security=security) as admin:
        await admin.create_topic(topic, 8)
    async with Producer("bench-secure", addr, header_format=header, security=security) as p:
        return await run(p)


def measure_all(work_dir, header, seconds, async_send, batch_send, cpu_meter) -> dict:
    """async_send / batch_send: e2e_bench's phase functions (producer, seconds)."""
    out = {}
    certs = make_dev_certs(os.path.join(work_dir, "certs"))
    sec_tls = ClientSecurity(tls_ca_file=certs["ca_cert"])
    sec_acl = ClientSecurity(credentials=Credentials("bench", _SECRET))
    phases = (
        ("tls", ["security.tls_enable=true", f"security.tls_cert_file={certs['server_cert']}",
                 f"security.tls_key_file={certs['server_key']}"], sec_tls, batch_send),
        ("acl", ["security.acl_enable=true",
                 f"security.acl_file={_acl_file(os.path.join(work_dir, 'acl.toml'))}"],
         sec_acl, async_send),
    )
    for name, settings, sec, fn in phases:
        os.makedirs(os.path.join(work_dir, name))
        broker = BrokerProcess(os.path.join(work_dir, name, "store"),
                               settings + ["store.commitlog_file_bytes=268435456"],
                               small_store=False)
        broker.start()
        try:
            cpu = cpu_meter(broker.proc.pid)

            async def run(p, fn=fn, cpu=cpu):
                await fn(p, 0.5)  # warm-up: connection, TLS handshake, routes
                cpu.start()
                res = await fn(p, seconds)
                return res, cpu.per_msg_us(res[-1])

            res, (client_us, broker_us) = asyncio.run(
                _phase(broker.addr, header, sec, "BenchSecure", run))
        finally:
            broker.stop()
            broker.kill()
        key = "tls_batch_send" if name == "tls" else "acl_async_send"
        out[f"{key}_msgs_s"] = round(res[0])
        out[f"{key}_client_cpu_us"], out[f"{key}_broker_cpu_us"] = client_us, broker_us
    return out
