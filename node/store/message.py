"""What the store takes in (StoreMessage) and what the dispatcher applies (dispatch requests).

A dispatch request is a plain tuple, for speed, with the fields named by the DR_* indexes:
(topic, queue_id, queue_offset, physical_offset, size, tags_code, store_timestamp, keys,
uniq_key, sys_flag); code reads it by those names. The put path builds it from the message it
encodes (request_of); a slave and recovery build it by parsing log bytes (parse_dispatch).
Both give the same tuple for the same record (tests/store/test_rebuild.py).
"""
from __future__ import annotations

import struct

from tidemq.protocol import accel
from tidemq.protocol import record as rec
from tidemq.protocol.jhash import java_string_hash

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# A scheduled record's consume-queue tag code is its due time (as in RocketMQ); the broker
# stamps the due time into this property when it stores the record, so parse and put paths
# agree.
PROP_DELIVER_AT_MS = "__DELIVER_AT_MS"
LOCAL_HOST = rec.encode_host("127.0.0.1", 10911)

DR_TOPIC, DR_QUEUE_ID, DR_QUEUE_OFFSET, DR_PHYS, DR_SIZE, DR_TAGS_CODE = 0, 1, 2, 3, 4, 5
DR_STORE_TS, DR_KEYS, DR_UNIQ_KEY, DR_SYS_FLAG = 6, 7, 8, 9


def tags_code(topic: str, tags: str | None, props: dict[str, str]) -> int:
    if topic == SCHEDULE_TOPIC:
        try:
            return int(props.get(PROP_DELIVER_AT_MS, "0"))
        except ValueError:
            return 0
    return java_string_hash(tags) if tags else 0


def is_dispatched_to_queue(sys_flag: int) -> bool:
    """PREPARED and ROLLBACK records never enter a consume queue (as in RocketMQ)."""
    tx = sys_flag & rec.SYSFLAG_TX_MASK
    return tx != rec.TX_PREPARED and tx != rec.TX_ROLLBACK


def raise_next_offsets(table: dict, request_lists) -> dict:
    """Move table[(topic, queue_id)] (the next queue offset) past every queued request of
    request_lists (lists of dispatch requests) and return table."""
    for reqs in request_lists:
        for r in reqs:
            if is_dispatched_to_queue(r[DR_SYS_FLAG]):
                key = (r[DR_TOPIC], r[DR_QUEUE_ID])
                table[key] = max(table.get(key, 0), r[DR_QUEUE_OFFSET] + 1)
    return table


class StoreMessage:
    """One message to append. `properties` must not contain the __CRC32# entry; the store adds
    it. The broker may pass `properties_raw`, the already-serialised form of `properties`."""

    __slots__ = ("topic", "topic_bytes", "queue_id", "body", "properties", "properties_raw",
                 "flag", "sys_flag", "born_timestamp", "born_host", "store_host",
                 "reconsume_times", "prepared_tx_offset", "tags", "keys", "uniq_key", "tags_code",
                 "size_no_crc", "dispatchable")

    def __init__(self, topic: str, queue_id: int, body: bytes, properties: dict | None = None,
                 *, properties_raw: bytes | None = None, flag: int = 0, sys_flag: int = 0,
                 born_timestamp: int = 0, born_host: bytes = LOCAL_HOST,
                 store_host: bytes = LOCAL_HOST, reconsume_times: int = 0,
                 prepared_tx_offset: int = 0):
        props = properties or {}
        self.topic = topic
        self.topic_bytes = topic.encode("utf-8")
        self.queue_id = queue_id
        self.body = body
        self.properties = props
        self.properties_raw = rec.encode_properties(props) if properties_raw is None else properties_raw
        self.flag = flag
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.store_host = store_host
        self.reconsume_times = reconsume_times
        self.prepared_tx_offset = prepared_tx_offset
        self.tags = props.get(rec.PROP_TAGS)
        self.keys = props.get(rec.PROP_KEYS)
        self.uniq_key = props.get(rec.PROP_UNIQ_KEY)
        self.tags_code = tags_code(topic, self.tags, props)
        self.size_no_crc = rec.record_size(len(body), len(self.topic_bytes),
                                           len(self.properties_raw), len(born_host) == 20,
                                           len(store_host) == 20, with_crc=False)
        self.dispatchable = is_dispatched_to_queue(sys_flag)

    @classmethod
    def many_from_wire(cls, topic: str, queue_id: int, entries, sys_flag: int,
                       born_timestamp: int, born_host: bytes, store_host: bytes,
                       reconsume_times: int = 0) -> list[StoreMessage]:
        """Messages of one send request, [(flag, body, properties_raw)], sharing everything
        else: the broker's hot path. Reads TAGS, KEYS and UNIQ_KEY straight from the raw
        properties (no dict); `properties` is left None."""
        if topic == SCHEDULE_TOPIC:  # tag code from a property: take the general path
            return [cls(topic, queue_id, body, rec.decode_properties(raw), properties_raw=raw,
                        flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp,
                        born_host=born_host, store_host=store_host,
                        reconsume_times=reconsume_times) for flag, body, raw in entries]
        return wire_messages(cls, topic, queue_id, entries, sys_flag, born_timestamp, born_host,
                             store_host, reconsume_times)


def wire_messages(cls, topic: str, queue_id: int, entries, sys_flag: int, born_timestamp: int,
                  born_host: bytes, store_host: bytes, reconsume_times: int) -> list:
    """many_from_wire's messages of any topic but SCHEDULE_TOPIC, built without __init__; a
    compiled twin when built (client/protocol/accel.py)."""
    topic_bytes = topic.encode("utf-8")
    base = rec.record_size(0, len(topic_bytes), 0, len(born_host) == 20,
                           len(store_host) == 20, with_crc=False)
    dispatchable = is_dispatched_to_queue(sys_flag)
    new = cls.__new__
    out = []
    fields = rec.prop_fields
    for flag, body, raw in entries:
        m = new(cls)
        m.topic, m.topic_bytes, m.queue_id, m.body = topic, topic_bytes, queue_id, body
        m.properties, m.properties_raw, m.flag, m.sys_flag = None, raw, flag, sys_flag
        m.born_timestamp, m.born_host, m.store_host = born_timestamp, born_host, store_host
        m.reconsume_times, m.prepared_tx_offset = reconsume_times, 0
        m.tags, m.keys, m.uniq_key, m.tags_code = fields(raw)
        m.size_no_crc = base + len(body) + len(raw)
        m.dispatchable = dispatchable
        out.append(m)
    return out


wire_messages = accel.pick(wire_messages)


def encode_message(out, pos: int, m: StoreMessage, queue_offset: int, phys: int, store_ts: int,
                   with_crc: bool, size: int) -> int:
    """Write m's record at out[pos:] where the log placed it (record.encode_into with the
    message's own fields); returns its size."""
    return rec.encode_into(out, pos, m.topic_bytes, m.queue_id, m.flag, queue_offset, phys,
                           m.sys_flag, m.born_timestamp, m.born_host, store_ts, m.store_host,
                           m.reconsume_times, m.prepared_tx_offset, m.body, m.properties_raw,
                           with_crc, size)


def request_of(m: StoreMessage, queue_offset: int, phys: int, size: int, store_ts: int) -> tuple:
    """The dispatch request (DR_* fields) of m stored at `phys`."""
    return (m.topic, m.queue_id, queue_offset, phys, size, m.tags_code, store_ts, m.keys,
            m.uniq_key, m.sys_flag)


_FIXED = struct.Struct(">iIiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP
_I64 = struct.Struct(">q")


_prop = rec.first_prop


def parse_dispatch(buf, pos: int, limit: int):
    """The dispatch request for the record at buf[pos:limit], read straight from the bytes
    (no body copy, no full property decode). Raises RecordError for anything else."""
    try:
        phys = _I64.unpack_from(buf, pos + rec.POS_PHYSICAL_OFFSET)[0]
    except struct.error:
        raise rec.RecordError(f"not a record at {pos}") from None
    layout = rec.check_record_layout(buf, pos, limit, phys, False)
    if layout.__class__ is int:
        raise rec.RecordError(f"not a record at {pos}")
    return dispatch_from_layout(buf, pos, layout)


def dispatch_from_layout(buf, pos: int, layout):
    """Build the dispatch request from check_record_layout()'s answer: the slave's and
    recovery's hot path."""
    total, topic_at, topic_len, props_at, props_len = layout
    _, _, _, qid, _, qoff, phys, sysflag, _ = _FIXED.unpack_from(buf, pos)
    store_ts = _I64.unpack_from(buf, pos + 48 + (20 if sysflag & rec.SYSFLAG_BORNHOST_V6 else 8))[0]
    try:
        topic = buf[topic_at:topic_at + topic_len].decode("utf-8")
    except UnicodeDecodeError:
        raise rec.RecordError(f"topic of the record at {pos} is not UTF-8") from None
    props = b"\x02" + buf[props_at:props_at + props_len]
    tags = _prop(props, b"\x02TAGS\x01")
    if topic == SCHEDULE_TOPIC:
        due = _prop(props, b"\x02" + PROP_DELIVER_AT_MS.encode() + b"\x01") or "0"
        code = tags_code(topic, tags, {PROP_DELIVER_AT_MS: due})
    else:
        code = java_string_hash(tags) if tags else 0
    return (topic, qid, qoff, phys, total, code, store_ts, _prop(props, b"\x02KEYS\x01"),
            _prop(props, b"\x02UNIQ_KEY\x01"), sysflag)
