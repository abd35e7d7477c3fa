"""Send replies encoded from templates: the generic header encoder costs about 3 µs a reply,
these a fraction of it, and the bytes are the same (tests/broker/test_units.py checks both
forms against encode_frame(make_response(...)) for JSON and ROCKETMQ headers).

Reply ext, in this order: msgId, queueId, queueOffset, MSG_REGION, TRACE_ON (as a Java broker
sends them). A batch's msgId joins one 32-character offsetMsgId per message (56 for an IPv6
store host) with ",", so the reply header grows 33-57 bytes a message: max_batch_messages keeps
it far inside the 24-bit header length (tests/broker/test_batch_limits.py).
"""
from __future__ import annotations

import json
import struct

from tidemq.protocol import accel
from tidemq.protocol.codes import FLAG_RESPONSE, SerializeType
from tidemq.protocol.remoting import LOCAL_LANGUAGE, LOCAL_VERSION

JSON_PREFIX = struct.Struct(">iI")  # length, word (type 0: the plain header length)


def json_reply_template(region: str) -> bytes:
    """JSON header of a send reply with %-slots for code, opaque, msgId, queueId, queueOffset;
    exactly what encode_frame_head writes for make_response(request, code, ext)."""
    head = (b'{"code":%%d,"language":"%s","version":%d,"opaque":%%d,"flag":%d,"extFields":'
            % (LOCAL_LANGUAGE.name.encode(), LOCAL_VERSION, FLAG_RESPONSE))
    ext = (b'{"msgId":"%%s","queueId":"%%d","queueOffset":"%%d","MSG_REGION":%s,'
           b'"TRACE_ON":"false"}}' % json.dumps(region).encode())
    return head + ext


def json_reply_frame(fmt: bytes, code: int, opaque: int, msg_id: str, queue_id: int,
                     queue_offset: int) -> bytes:
    """A JSON-header send reply frame: `fmt` (json_reply_template's) filled in with code and
    opaque (%d), msg_id (%s), queue_id and queue_offset (%d), behind its length prefix. A
    compiled twin when built."""
    header = fmt % (code, opaque, msg_id.encode(), queue_id, queue_offset)
    return JSON_PREFIX.pack(len(header) + 4, len(header)) + header


json_reply_frame = accel.pick(json_reply_frame)

_BIN_FIXED = struct.Struct(">iIhbhiiii")  # length, word, code, language, version, opaque,
#                                           flag, remarkLen, extLen
_BIN_TYPE = int(SerializeType.ROCKETMQ) << 24
_K_MSG_ID = b"\x00\x05msgId"
_K_QUEUE_ID = b"\x00\x07queueId"
_K_QUEUE_OFFSET = b"\x00\x0bqueueOffset"
_I32 = struct.Struct(">i")


def binary_reply_tail(region: str) -> bytes:
    """The constant end of a binary send reply's ext map: MSG_REGION and TRACE_ON."""
    raw = region.encode("utf-8", "replace")
    return (b"\x00\x0aMSG_REGION" + _I32.pack(len(raw)) + raw
            + b"\x00\x08TRACE_ON" + _I32.pack(5) + b"false")


def binary_reply_frame(tail: bytes, code: int, opaque: int, msg_id: str, queue_id: int,
                       queue_offset: int) -> bytes:
    """A ROCKETMQ-header send reply, byte for byte what encode_frame(make_response(...))
    writes (the ext keys in the same order), for a fraction of the cost."""
    mid, qid, qoff = msg_id.encode(), b"%d" % queue_id, b"%d" % queue_offset
    ext = b"".join((_K_MSG_ID, _I32.pack(len(mid)), mid, _K_QUEUE_ID, _I32.pack(len(qid)), qid,
                    _K_QUEUE_OFFSET, _I32.pack(len(qoff)), qoff, tail))
    header_len = 21 + len(ext)
    return _BIN_FIXED.pack(4 + header_len, _BIN_TYPE | header_len, code, LOCAL_LANGUAGE,
                           LOCAL_VERSION, opaque, FLAG_RESPONSE, 0, len(ext)) + ext
