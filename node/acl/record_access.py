"""Requests whose resource is a stored record: its topic is known only after reading it.

| code | record at | needs on the record's topic |
|---|---|---|
| 33 view message by id | ext offset | SUB |
| 36 send back | ext offset | SUB (else a group's SUB would copy any topic's message into its retry topic) |
| 37 end transaction | ext commitLogOffset | PUB (the half message's REAL_TOPIC) |

A record stored in an internal topic (delayed messages in SCHEDULE_TOPIC_XXXX, half messages)
belongs to its REAL_TOPIC property; an internal record without one (transaction op records) is
for admin accounts only. Only a record that really starts at the offset counts (its
PHYSICALOFFSET field matches, as the processors require); otherwise nothing is served and the
processor answers "not found", so the check lets the request through.
"""
from __future__ import annotations

import struct

from client.protocol import record as rec
from client.protocol.codes import RequestCode as R
from node.acl.accounts import PUB, SUB
from node.acl.resources import AclRequestError, is_internal_topic

RECORD_CODES = {R.VIEW_MESSAGE_BY_ID: ("offset", SUB), R.CONSUMER_SEND_MSG_BACK: ("offset", SUB),
                R.END_TRANSACTION: ("commitLogOffset", PUB)}
ADMIN_ONLY = None  # record_needs' topic when only an admin may touch the record
_I64 = struct.Struct(">q")


def record_needs(cmd, read_record) -> tuple[str | None, int] | None:
    """(topic, perm) the caller needs on the record this request names, ADMIN_ONLY as the topic
    for an internal record, or None when the code names no record or none starts there.
    read_record(offset) -> bytes (the store's get_record)."""
    rule = RECORD_CODES.get(cmd.code)
    if rule is None:
        return None
    field, perm = rule
    raw = (cmd.ext or {}).get(field)
    try:
        offset = int(raw)
    except (TypeError, ValueError):
        raise AclRequestError(f"request {cmd.code} lacks a numeric {field}") from None
    data = read_record(offset) if offset >= 0 else b""
    if not data or len(data) < 36 or _I64.unpack_from(data, rec.POS_PHYSICAL_OFFSET)[0] != offset:
        return None
    try:
        m = rec.decode_record(data)
    except rec.RecordError:  # a record the processor would serve must decode; refuse
        raise AclRequestError(f"unreadable record at {field} {offset}") from None
    topic = m.topic
    if is_internal_topic(topic):
        topic = m.properties.get(rec.PROP_REAL_TOPIC) or ADMIN_ONLY
    return topic, perm
