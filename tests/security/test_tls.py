"""TLS on a real broker: the SDK works end to end; a plaintext client, a client that does not
trust the broker's CA, and (mutual TLS) a client without a certificate are refused; the admin
port speaks HTTPS; config mistakes are reported before anything starts."""
import asyncio
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.security.conftest import tls_settings
from tests.support.broker_proc import REPO_ROOT
from tidemq import errors
from tidemq.consumer.push import PushConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.remoting import RemotingCommand, encode_frame
from tidemq.security import ClientSecurity
from tidemq.tls import client_context


@pytest.fixture
def tls_broker(broker_factory, certs):
    return broker_factory(*tls_settings(certs), "security.admin_tls_enable=true").start()


async def _produce_consume(addr, sec, n=20):
    p = Producer("tls-p", addr, security=sec)
    await p.start()
    try:
        results = [await p.send(Message("TlsTopic", b"tls-%d" % i)) for i in range(n)]
        batch = await p.send_batch([Message("TlsTopic", b"tls-b%d" % i) for i in range(10)])
    finally:
        await p.shutdown()
    got, done = [], asyncio.Event()

    def listener(msgs):
        got.extend(msgs)
        if len(got) >= n + 10:
            done.set()

    c = PushConsumer("tls-g", {"TlsTopic": "*"}, listener, consume_from="FIRST",
                     namesrv_or_broker=addr, security=sec)
    await c.start()
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await c.shutdown()
    return results, batch, got


def test_sdk_end_to_end_over_tls(tls_broker, certs):
    sec = ClientSecurity(tls_ca_file=certs["ca_cert"])
    results, batch, got = asyncio.run(_produce_consume(tls_broker.addr, sec))
    assert all(r.ok for r in results) and batch.ok
    assert {m.body for m in got} >= {b"tls-%d" % i for i in range(20)}


def test_plaintext_client_to_tls_port_is_refused(tls_broker):
    frame = encode_frame(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                 {"topic": "TBW102"}))
    with socket.create_connection(("127.0.0.1", tls_broker.port), timeout=5) as s:
        s.sendall(frame)
        s.settimeout(5)
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    assert b"TBW102" not in data and not data.startswith(b"\x00")  # never a remoting reply

    async def sdk():
        p = Producer("plain-p", tls_broker.addr, request_timeout_s=2, send_timeout_s=2)
        await p.start()
        try:
            await p.send(Message("TlsTopic", b"x"))
        finally:
            await p.shutdown()

    with pytest.raises(errors.TideMQError):
        asyncio.run(sdk())
    assert tls_broker.alive


def test_client_with_untrusted_ca_is_refused(tls_broker, other_certs):
    sec = ClientSecurity(tls_ca_file=other_certs["ca_cert"])

    async def sdk():
        p = Producer("untrusting", tls_broker.addr, security=sec, send_timeout_s=3)
        await p.start()
        try:
            await p.send(Message("TlsTopic", b"x"))
        finally:
            await p.shutdown()

    with pytest.raises(errors.TideMQError) as exc_info:
        asyncio.run(sdk())
    assert "CERTIFICATE_VERIFY_FAILED" in str(exc_info.value) or "certificate" in str(exc_info.value)


def test_mutual_tls_refuses_a_client_without_certificate(broker_factory, certs):
    b = broker_factory(*tls_settings(certs), "security.tls_require_client_cert=true").start()
    no_cert = ClientSecurity(tls_ca_file=certs["ca_cert"])
    with_cert = ClientSecurity(tls_ca_file=certs["ca_cert"], tls_cert_file=certs["client_cert"],
                               tls_key_file=certs["client_key"])

    async def send_one(sec):
        p = Producer("mtls", b.addr, security=sec, send_timeout_s=3, request_timeout_s=3)
        await p.start()
        try:
            return await p.send(Message("MtlsTopic", b"x"))
        finally:
            await p.shutdown()

    assert asyncio.run(send_one(with_cert)).ok
    with pytest.raises(errors.TideMQError):
        asyncio.run(send_one(no_cert))


def test_admin_port_speaks_https_only(tls_broker, certs):
    url = f"https://127.0.0.1:{tls_broker.admin_port}/health"
    ctx = client_context(certs["ca_cert"])
    with urllib.request.urlopen(url, context=ctx, timeout=5) as r:
        assert r.status == 200
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{tls_broker.admin_port}/health", timeout=5)
    with pytest.raises(urllib.error.URLError) as exc_info:
        urllib.request.urlopen(url, context=ssl.create_default_context(), timeout=5)
    assert "CERTIFICATE_VERIFY_FAILED" in str(exc_info.value)


def test_bad_tls_settings_fail_before_start(tmp_path, certs):
    proc = subprocess.run(
        [sys.executable, "-m", "tidemq.node", "--set", "listen_port=0", "--set", "admin_port=0",
         "--set", f"store.root_dir={tmp_path}/s", "--set", "security.tls_enable=true",
         "--set", f"security.tls_cert_file={tmp_path}/missing.pem",
         "--set", f"security.tls_key_file={certs['server_key']}",
         "--set", "security.acl_enable=true"],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert proc.returncode == 2
    assert "missing.pem" in proc.stderr and "security.acl_file is required" in proc.stderr
    assert "BEGIN" not in proc.stderr  # no key material in errors


def test_cli_over_tls_with_credentials_from_env(broker_factory, certs, tmp_path):
    b = broker_factory(*tls_settings(certs)).start()
    env = {"PYTHONPATH": REPO_ROOT, "PATH": "/usr/bin:/bin", "TIDEMQ_TLS_CA": certs["ca_cert"]}
    out = subprocess.run([sys.executable, "-m", "tidemq.cli.main", "-b", b.addr, "produce", "CliTls",
                          "--count", "50", "--batch", "10"], capture_output=True, text=True,
                         timeout=120, cwd=REPO_ROOT, env=env)
    assert out.returncode == 0, out.stderr
    assert '"sent": 50' in out.stdout
    start = time.monotonic()
    plain = subprocess.run([sys.executable, "-m", "tidemq.cli.main", "-b", b.addr, "topic", "list"],
                           capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                           env={k: v for k, v in env.items() if k != "TIDEMQ_TLS_CA"})
    assert plain.returncode == 1 and time.monotonic() - start < 60


def test_certs_command_writes_private_keys_and_refuses_to_overwrite(tmp_path):
    import json
    import os
    cmd = [sys.executable, "-m", "tidemq.cli.main", "certs", str(tmp_path / "c"), "--host", "10.0.0.5"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert first.returncode == 0, first.stderr
    files = json.loads(first.stdout)
    assert oct(os.stat(files["server_key"]).st_mode & 0o777) == "0o600"
    ctx = ssl.create_default_context(cafile=files["ca_cert"])  # the CA loads and is a CA
    assert ctx.cert_store_stats()["x509_ca"] == 1
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert again.returncode == 1 and "--force" in again.stderr
