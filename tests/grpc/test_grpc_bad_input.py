"""Bad gRPC requests get a clear Status (no exception text) and change nothing; the broker
keeps serving. Driven with grpcio and TideMQ's own definitions (no SDK checks in the way)."""
from __future__ import annotations

import pytest

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("tidemq.node.grpc.proto")

META = (("x-mq-client-id", "bad-input-test"),)


@pytest.fixture
def channel(grpc_broker):
    with grpc.insecure_channel(f"127.0.0.1:{grpc_broker.grpc_port}") as ch:
        yield ch


def unary(channel, method, request, response_cls, metadata=META):
    call = channel.unary_unary(f"/{pb.SERVICE}/{method}",
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=response_cls.FromString)
    return call(request, metadata=metadata, timeout=10)


def receive(channel, request, metadata=META):
    call = channel.unary_stream(f"/{pb.SERVICE}/ReceiveMessage",
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=pb.ReceiveMessageResponse.FromString)
    return list(call(request, metadata=metadata, timeout=30))


def send(channel, topic="BadInT", body=b"x", **user_props):
    req = pb.SendMessageRequest()
    m = req.messages.add(body=body)
    m.topic.name = topic
    m.system_properties.message_id = "ID-1"
    m.user_properties.update(user_props)
    return unary(channel, "SendMessage", req, pb.SendMessageResponse)


def receive_request(topic="BadInT", group="BadG", invisible_ms=30_000, batch=8, wait_ms=100):
    req = pb.ReceiveMessageRequest(batch_size=batch)
    req.group.name = group
    req.message_queue.topic.name = topic
    req.invisible_duration.FromMilliseconds(invisible_ms)
    req.long_polling_timeout.FromMilliseconds(wait_ms)
    return req


def assert_clear(status, code):
    assert status.code == code, status
    assert status.message and "Traceback" not in status.message and "Error(" not in status.message


def test_bad_sends_are_refused_and_store_nothing(channel):
    assert_clear(send(channel, body=b"").status, pb.Code.MESSAGE_BODY_EMPTY)
    assert_clear(send(channel, REAL_TOPIC="Other").status, 40007)
    assert_clear(send(channel, topic="bad topic!").status, pb.Code.TOPIC_NOT_FOUND)
    for internal in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "TBW102"):
        assert_clear(send(channel, topic=internal).status, pb.Code.FORBIDDEN)
    assert_clear(send(channel, body=b"x" * (4 * 1024 * 1024 + 1)).status,
                 pb.Code.MESSAGE_BODY_TOO_LARGE)
    # nothing of the above was stored: a consumer finds nothing at all
    out = receive(channel, receive_request(topic="BadInT", group="BadEmptyG"))
    assert [r.status.code for r in out] == [pb.Code.MESSAGE_NOT_FOUND]
    assert send(channel).status.code == pb.Code.OK


def test_bad_receives_acks_and_changes(channel):
    assert send(channel, topic="BadRecvT").status.code == pb.Code.OK
    out = receive(channel, receive_request(topic="BadRecvT"), metadata=())
    assert_clear(out[0].status, pb.Code.CLIENT_ID_REQUIRED)
    assert_clear(receive(channel, receive_request(topic="BadRecvT", invisible_ms=10))[0].status,
                 pb.Code.ILLEGAL_INVISIBLE_TIME)
    assert_clear(receive(channel, receive_request(topic="BadRecvT", batch=10**6))[0].status,
                 pb.Code.BAD_REQUEST)
    assert_clear(receive(channel, receive_request(topic="NoSuchTopicX"))[0].status,
                 pb.Code.TOPIC_NOT_FOUND)
    assert_clear(receive(channel, receive_request(topic="TIDEMQ_SYS_BROKER_STATE"))[0].status,
                 pb.Code.FORBIDDEN)
    req = receive_request(topic="BadRecvT")
    req.filter_expression.type = pb.enum_value("FilterType", "SQL")
    req.filter_expression.expression = "a BETWEEN"
    assert_clear(receive(channel, req)[0].status, pb.Code.ILLEGAL_FILTER_EXPRESSION)
    ack = pb.AckMessageRequest()
    ack.group.name, ack.topic.name = "BadG", "BadRecvT"
    for handle in ("zz", "1.2", "0.0.9", "-1.0.1"):
        ack.entries.add(message_id="x", receipt_handle=handle)
    resp = unary(channel, "AckMessage", ack, pb.AckMessageResponse)
    assert [e.status.code for e in resp.entries] == [pb.Code.INVALID_RECEIPT_HANDLE] * 4
    change = pb.ChangeInvisibleDurationRequest(receipt_handle="0.0.1")
    change.group.name, change.topic.name = "BadG", "BadRecvT"
    change.invisible_duration.FromMilliseconds(0)
    resp = unary(channel, "ChangeInvisibleDuration", change, pb.ChangeInvisibleDurationResponse)
    assert_clear(resp.status, pb.Code.ILLEGAL_INVISIBLE_TIME)
    # the message is still there for a well-formed receive
    out = receive(channel, receive_request(topic="BadRecvT"))
    assert out[0].status.code == pb.Code.OK and out[1].message.body == b"x"


def test_bad_transaction_ids_and_garbage_bytes(channel, grpc_broker):
    end = pb.EndTransactionRequest(transaction_id="not-a-tx", message_id="x")
    end.topic.name = "BadInT"
    resp = unary(channel, "EndTransaction", end, pb.EndTransactionResponse)
    assert_clear(resp.status, pb.Code.INVALID_TRANSACTION_ID)
    raw = channel.unary_unary(f"/{pb.SERVICE}/SendMessage")
    with pytest.raises(grpc.RpcError) as info:
        raw(b"\xff\xff\xff\xff garbage", metadata=META, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "malformed request"
    assert send(channel).status.code == pb.Code.OK  # still serving
    assert "Traceback" not in grpc_broker.log_text()  # nothing above was an unexpected failure


def test_forward_to_dead_letter_queue(channel, grpc_broker):
    from tests.grpc.test_grpc_messaging import dlq_bodies
    assert send(channel, topic="FwdT", body=b"give-up").status.code == pb.Code.OK
    out = receive(channel, receive_request(topic="FwdT", group="FwdG"))
    handle = out[1].message.system_properties.receipt_handle
    fwd = pb.ForwardMessageToDeadLetterQueueRequest(receipt_handle=handle, delivery_attempt=1,
                                                    max_delivery_attempts=1)
    fwd.group.name, fwd.topic.name = "FwdG", "FwdT"
    resp = unary(channel, "ForwardMessageToDeadLetterQueue", fwd,
                 pb.ForwardMessageToDeadLetterQueueResponse)
    assert resp.status.code == pb.Code.OK
    assert dlq_bodies(grpc_broker, "FwdG") == ["give-up"]
    # done: neither a stale-handle ack nor a later receive brings it back
    ack = pb.AckMessageRequest()
    ack.group.name, ack.topic.name = "FwdG", "FwdT"
    ack.entries.add(message_id="x", receipt_handle=handle)
    assert unary(channel, "AckMessage", ack, pb.AckMessageResponse).status.code == pb.Code.OK
    out = receive(channel, receive_request(topic="FwdT", group="FwdG", wait_ms=500))
    assert [r.status.code for r in out] == [pb.Code.MESSAGE_NOT_FOUND]
