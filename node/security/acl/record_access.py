"""Requests whose resource is a stored record: its topic is known only after reading it.

The request table (node/requests/table.py, a row's `record`) says which field holds the offset:

| code | record at | needs on the record's topic |
|---|---|---|
| 33 view message by id | offset | SUB |
| 36 send back | offset | SUB (else a group's SUB would copy any topic's message into its retry topic) |
| 37 end transaction | commitLogOffset | PUB (the half message's REAL_TOPIC) |

A record stored in an internal topic (delayed messages in SCHEDULE_TOPIC_XXXX, half messages)
belongs to its REAL_TOPIC property; an internal record without one (transaction op records) is
for admin accounts only. Only a record that really starts at the offset counts (its
PHYSICALOFFSET field matches, as the processors require); otherwise nothing is served and the
processor answers "not found", so the check lets the request through.
"""
from __future__ import annotations

import struct

from tidemq.node.requests import SPECS
from tidemq.node.security.acl.resources import AclRequestError, is_internal_topic
from tidemq.protocol import record as rec

RECORD_CODES = frozenset(code for code, spec in SPECS.items() if spec.record is not None)
ADMIN_ONLY = None  # record_needs' topic when only an admin may touch the record
_I64 = struct.Struct(">q")


def record_needs(code: int, req, read_record) -> tuple[str | None, int] | None:
    """(topic, perm) the caller needs on the record this request names, ADMIN_ONLY as the topic
    for an internal record, or None when the code names no record or none starts there.
    read_record(offset) -> bytes (the store's get_record)."""
    spec = SPECS.get(code)
    if spec is None or spec.record is None or req is None:
        return None
    field, perm = spec.record
    offset = getattr(req, field)  # an int64: the table checked it
    data = read_record(offset) if offset >= 0 else b""
    if not data or len(data) < 36 or _I64.unpack_from(data, rec.POS_PHYSICAL_OFFSET)[0] != offset:
        return None
    try:
        m = rec.decode_record(data)
    except rec.RecordError:  # a record the processor would serve must decode; refuse
        raise AclRequestError(f"unreadable record at {field} {offset}") from None
    topic = m.topic
    if is_internal_topic(topic):
        return m.properties.get(rec.PROP_REAL_TOPIC) or ADMIN_ONLY, perm
    return topic, perm
