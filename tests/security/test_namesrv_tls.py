"""A real name server (`tidemq namesrv` on a real ZooKeeper) with TLS on both of its ports:
the SDK's remoting client gets answers over TLS, a plaintext client gets none, the HTTP view
speaks HTTPS and refuses changes without the admin token."""
import asyncio
import urllib.error
import urllib.request

import pytest

from tests.support.namesrv_proc import NameServerProcess
from tidemq import errors
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.remoting_client import RemotingClient
from tidemq.security import ClientSecurity
from tidemq.tls import client_context


@pytest.fixture
def tls_namesrv(zk_hosts, tmp_path, certs):
    ns = NameServerProcess(zk_hosts, "TlsCluster", str(tmp_path / "ns.log"))
    ns.cmd += ["--tls-cert", certs["server_cert"], "--tls-key", certs["server_key"]]
    ns.start()
    yield ns
    ns.stop()


async def _route(addr, security):
    rc = RemotingClient(security=security, connect_timeout_s=3, request_timeout_s=3)
    try:
        return await rc.invoke(addr, rc.command(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                {"topic": "NoSuchTopic"}))
    finally:
        await rc.close()


def test_namesrv_remoting_and_http_over_tls(tls_namesrv, certs):
    resp = asyncio.run(_route(tls_namesrv.addr, ClientSecurity(tls_ca_file=certs["ca_cert"])))
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST  # a real answer, over TLS
    with pytest.raises(errors.TideMQError):
        asyncio.run(_route(tls_namesrv.addr, None))
    https = tls_namesrv.http_url.replace("http://", "https://")
    ctx = client_context(certs["ca_cert"])
    with urllib.request.urlopen(https + "/health", context=ctx, timeout=5) as r:
        assert r.status == 200
    req = urllib.request.Request(https + "/cluster", method="POST", data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as exc_info:
        urllib.request.urlopen(req, context=ctx, timeout=5)
    assert exc_info.value.code in (401, 403)
