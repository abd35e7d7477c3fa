"""gRPC with the remoting security settings: the ACL file's accounts and permissions (signed by
the RocketMQ 5 SDK), and TLS with the broker's certificate."""
from __future__ import annotations

import pytest

from tests.grpc.conftest import GRPC_SETTINGS, _require_sdk
from tests.grpc.test_grpc_messaging import receive_until
from tests.security.conftest import SECRET_ALICE, certs, tls_settings, write_acl  # noqa: F401

FORBIDDEN, UNAUTHORIZED = 40300, 40100
ALICE = {"RMQ5_AK": "alice", "RMQ5_SK": SECRET_ALICE}


@pytest.fixture
def acl_grpc_broker(broker_factory, tmp_path):
    _require_sdk()
    path = write_acl(tmp_path / "acl.toml")
    return broker_factory(*GRPC_SETTINGS, "security.acl_enable=true",
                          f"security.acl_file={path}").start()


def test_acl_permits_signed_requests_and_refuses_the_rest(sdk, acl_grpc_broker):
    p = sdk(acl_grpc_broker, ALICE)
    p.ok("producer", topics=["AclOrders"])
    p.ok("send", topic="AclOrders", body="allowed")
    r = p.call("send", topic="AclClosed", body="denied")
    assert not r["ok"] and r["code"] == FORBIDDEN and "PUB" in r["message"], r
    assert "alice" in r["message"] and SECRET_ALICE not in r["message"]
    c = sdk(acl_grpc_broker, ALICE)
    c.ok("simple", group="AclG", topic="AclOrders", await_s=1)
    assert [m["body"] for m in receive_until(c, 1)] == ["allowed"]
    closed = sdk(acl_grpc_broker, ALICE)
    closed.ok("simple", group="AclG2", topic="AclClosed", await_s=1)
    r = closed.call("receive", max=8, invisible_s=30)
    assert not r["ok"] and r["code"] == FORBIDDEN, r


def test_acl_refuses_bad_signatures_and_anonymous_clients(acl_grpc_broker):
    grpc = pytest.importorskip("grpc")
    from tidemq.node.grpc import proto as pb
    with grpc.insecure_channel(f"127.0.0.1:{acl_grpc_broker.grpc_port}") as ch:
        call = ch.unary_unary(f"/{pb.SERVICE}/QueryRoute",
                              request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=pb.QueryRouteResponse.FromString)
        req = pb.QueryRouteRequest()
        req.topic.name = "AclOrders"
        bad = "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=00ff"
        for metadata, words in (((("authorization", bad), ("x-mq-date-time", "20260101T000000Z")),
                                 "signature mismatch"),
                                ((), "anonymous requests are not allowed")):
            resp = call(req, metadata=metadata, timeout=10)
            assert resp.status.code == UNAUTHORIZED and words in resp.status.message
            assert not resp.message_queues


def test_tls_clients_send_and_receive(sdk, broker_factory, certs):  # noqa: F811
    _require_sdk()
    b = broker_factory(*GRPC_SETTINGS, *tls_settings(certs)).start()
    env = {"RMQ5_TLS": "1", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": certs["ca_cert"]}
    p = sdk(b, env)
    p.ok("producer", topics=["TlsT"])
    p.ok("send", topic="TlsT", body="secret")
    c = sdk(b, env)
    c.ok("simple", group="TlsG", topic="TlsT", await_s=1)
    assert [m["body"] for m in receive_until(c, 1)] == ["secret"]
    plain = sdk(b)  # no TLS: the handshake never completes, nothing is sent
    plain.ok("producer", topics=["TlsT"])
    assert not plain.call("send", topic="TlsT", body="plain", timeout=60)["ok"]
