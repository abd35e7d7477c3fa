"""Send header templates produce what the protocol's own encoder would (same fields, same values)."""
import pytest

from tidemq.producer.send_codec import SendHeaderTemplate, decode_batch_body, encode_batch_body
from tidemq.protocol.codes import SerializeType
from tidemq.protocol.remoting import RemotingCommand, decode_frame, encode_frame

PROPS = "UNIQ_KEY\x01ABCDEF\x02TAGS\x01t\u00e9\"\\\x02WAIT\x01true\x02"


@pytest.mark.parametrize("st", [SerializeType.JSON, SerializeType.ROCKETMQ])
@pytest.mark.parametrize("v2,batch,code", [(False, False, 10), (True, False, 310), (True, True, 320),
                                           (False, True, 10)])
@pytest.mark.parametrize("group,topic", [("pg", "T1"), ("%RETRY%g", "%RETRY%g")])
def test_template_equals_protocol_encoding(st, v2, batch, code, group, topic):
    tmpl = SendHeaderTemplate(group, topic, serialize_type=st, v2=v2, batch=batch)
    body = b"payload"
    frame = tmpl.frame_head(77, 3, 1, 1700000000123, 9, tmpl.encode_props(PROPS), len(body),
                            reconsume_times=2, frame_flag=2) + body
    got = decode_frame(frame)
    keys = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m") if v2 else (
        "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
        "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "batch")
    values = (group, topic, "TBW102", "4", "3", "1", "1700000000123", "9", PROPS, "2", "false",
              "true" if batch else "false")
    want = RemotingCommand(code, opaque=77, flag=2, ext=dict(zip(keys, values)), body=body,
                           serialize_type=st)
    assert got == decode_frame(encode_frame(want))
    assert got.code == code and got.ext["topic" if not v2 else "b"] == topic


def test_batch_body_round_trip():
    entries = [(0, b"one", "UNIQ_KEY\x01A\x02"), (5, b"", "UNIQ_KEY\x01B\x02TAGS\x01x\x02"),
               (1, b"\x00" * 1000, "")]
    raw = encode_batch_body(entries)
    assert decode_batch_body(raw) == entries
    assert int.from_bytes(raw[:4], "big") == 20 + 3 + 2 + len("UNIQ_KEY\x01A\x02")


@pytest.mark.parametrize("st", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_values_outside_the_precomputed_range(st):
    tmpl = SendHeaderTemplate("pg", "T", serialize_type=st)
    frame = tmpl.frame_head(1, -1, 0, 5, 123456, tmpl.encode_props(""), 0, reconsume_times=2000)
    ext = decode_frame(frame).ext
    assert (ext["queueId"], ext["flag"], ext["reconsumeTimes"], ext["bornTimestamp"]) == (
        "-1", "123456", "2000", "5")


@pytest.mark.parametrize("st", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_bare_props_equal_encoded_text(st):
    """A bare message's wire properties come from its key alone, identical to encoding the
    full text the producer would otherwise build."""
    from tidemq.message import Message, uniq_keys
    from tidemq.producer.producer import _properties_text

    tmpl = SendHeaderTemplate("pg", "T", serialize_type=st)
    for key in [uniq_keys.next() for _ in range(50)] + ["0" * 32, "F" * 32]:
        assert tmpl.bare_props(key) == tmpl.encode_props(_properties_text(Message("T", b"x"), key))


def test_reply_result_decodes_its_fields_when_read():
    from tidemq.producer.producer import SendResult, SendStatus
    from tidemq.topic_routes import MessageQueue

    mq = MessageQueue("T", "b", 1)
    odd = SendResult.from_reply(SendStatus.SEND_OK, "K", mq,
                                {"msgId": "M", "queueId": "2", "queueOffset": "x"})
    assert (odd.offset_msg_id, odd.queue, odd.queue_offset, odd.region_id, odd.transaction_id) == (
        "M", MessageQueue("T", "b", 2), -1, None, None)
    usual = SendResult.from_reply(SendStatus.FLUSH_DISK_TIMEOUT, "K", mq, {
        "queueId": "1", "queueOffset": "5", "MSG_REGION": "R", "transactionId": "t"})
    assert (usual.queue, usual.queue_offset, usual.region_id, usual.transaction_id) == (
        mq, 5, "R", "t")
    assert usual.maybe_stored and not usual.ok and "queue_offset=5" in repr(usual)
    built = SendResult(SendStatus.SEND_OK, "K", "M", mq, 9, "R", "t")
    assert (built.offset_msg_id, built.queue, built.queue_offset, built.region_id,
            built.transaction_id, built.ok) == ("M", mq, 9, "R", "t", True)
