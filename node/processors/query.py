"""QUERY_MESSAGE (12) by key and VIEW_MESSAGE_BY_ID (33) (RocketMQ's QueryMessageProcessor).

12: ext topic, key, maxNum, beginTimestamp, endTimestamp, optional _UNIQUE_KEY_QUERY (then
    maxNum is 32, Java's defaultQueryMaxNum). maxNum is capped at query_max_msgs. Reply 0 with
    ext indexLastUpdateTimestamp / indexLastUpdatePhyoffset and the records; nothing -> 22.
33: ext offset (commit-log position, from the offsetMsgId). Reply 0 with exactly one record,
    or 1 "can not find message by the offset, <n>". Only a record that really starts at that
    offset is served (its PHYSICALOFFSET field must match), so a forged offset into the middle
    of a body returns nothing.
Records carry this broker's advertised address as STOREHOST (node/processors/store_host.py).
"""
from __future__ import annotations

import struct

from tidemq.node.processors.common import error, ok
from tidemq.node.processors.store_host import join_records
from tidemq.node.store.reader import store_timestamp_of
from tidemq.protocol import record as rec
from tidemq.protocol.codes import ResponseCode

_I64 = struct.Struct(">q")
_UNIQUE_MAX = 32
REPLY_BYTES_MAX = 4 * 1024 * 1024  # bounds one reply; at least one record is always served


class QueryProcessor:
    def __init__(self, store, store_host: bytes, max_msgs: int):
        self.store = store
        self.store_host = store_host  # the advertised address, as records carry it
        self.max_msgs = max_msgs

    def query_message(self, conn, cmd, req):
        topic, key, max_num, begin, end = req.topic, req.key, req.max_num, req.begin_ms, req.end_ms
        if req.unique_key:
            max_num = _UNIQUE_MAX
        max_num = max(1, min(max_num, self.max_msgs))
        records = _cap(self.store.query_by_key(topic, key, max_num, begin, end))
        if not records:
            return error(cmd, ResponseCode.QUERY_NOT_FOUND,
                         "can not find message, maybe time range not correct")
        ext = {"indexLastUpdateTimestamp": str(max(store_timestamp_of(r) for r in records)),
               "indexLastUpdatePhyoffset": str(self.store.dispatcher.dispatched_offset)}
        return ok(cmd, ext, join_records(records, self.store_host))

    def view_message(self, conn, cmd, req):
        offset = req.offset
        data = self.store.get_record(offset) if offset >= 0 else b""
        if not data or len(data) < 36 or _I64.unpack_from(data, rec.POS_PHYSICAL_OFFSET)[0] != offset:
            return error(cmd, ResponseCode.SYSTEM_ERROR,
                         f"can not find message by the offset, {offset}")
        return ok(cmd, body=join_records([data], self.store_host))


def _cap(records: list) -> list:
    total = 0
    for i, r in enumerate(records):
        total += len(r)
        if total > REPLY_BYTES_MAX and i:
            return records[:i]
    return records
