"""Bad-header cases generated from the request table (node/requests/table.py), so a field added
there is tested without writing a test: for every request code, a valid header built from the
fields' kinds, and for every field the ways a client can get it wrong.

    valid_request(code) -> (ext, body)
    field_cases() -> [Case(code, field names, what, ext, body, refused)]

`refused`: the table must refuse the frame (1 SYSTEM_ERROR naming the field); otherwise the
case only must be answered cleanly (e.g. a negative queue id on a send picks a queue).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from tidemq.node.requests import SPECS
from tidemq.node.requests.fields import Bool, Choice, Int, Name, Text
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.route_json import ConsumerData, HeartbeatData, SubscriptionData, encode_heartbeat

TOPIC = "EdgeT"       # the module's topic: 4 queues, its consume queues are watched
GROUP = "EdgeG"
SCRATCH = "EdgeScratch"  # for codes that create or delete topics
# Codes whose valid sample must not touch TOPIC (they create or delete it).
_SCRATCH_CODES = {R.UPDATE_AND_CREATE_TOPIC, R.DELETE_TOPIC_IN_BROKER}
# Exception text or Python reprs a reply remark must never carry.
LEAKS = ("Error(", "Exception(", "Traceback", "KeyError", "ValueError", "TypeError",
         "struct.error", "JSONDecodeError", "File \"")


def json_body(**doc) -> bytes:
    """A request body: the keyword arguments as a JSON object."""
    return json.dumps(doc).encode()


def leaked(remark: str | None) -> str | None:
    """The first sign of exception text in a remark, or None."""
    for needle in LEAKS:
        if remark and needle in remark:
            return needle
    return None


def _sample(code: int, field) -> str:
    kind = field.kind
    if isinstance(kind, Name):
        if "group" in field.attr.lower() or field.names[0] in ("groupName", "group"):
            return GROUP
        return SCRATCH if code in _SCRATCH_CODES else TOPIC
    if isinstance(kind, Int):
        return "1" if field.attr in ("read_queues", "write_queues", "max_msgs", "max_num") else "0"
    if isinstance(kind, Bool):
        return "false"
    if isinstance(kind, Choice):
        return kind.words[0]
    return "x"


def _body(code: int) -> bytes:
    if code == R.HEART_BEAT:
        sub = SubscriptionData(TOPIC, "*")
        consumer = ConsumerData(GROUP, subscriptions=[sub])
        return encode_heartbeat(HeartbeatData("edge-client", [], [consumer]))
    if code in (R.LOCK_BATCH_MQ, R.UNLOCK_BATCH_MQ):
        return json.dumps({"consumerGroup": GROUP, "clientId": "edge-client", "mqSet": [
            {"topic": TOPIC, "brokerName": "b", "queueId": 0}]}).encode()
    if code == R.BATCH_PULL_MESSAGE:
        return json.dumps({"queues": [[TOPIC, 0, 0, -1]]}).encode()
    if code == R.UPDATE_CONSUMER_OFFSET_BATCH:
        return json.dumps({"offsets": [[TOPIC, 0, 0]]}).encode()
    if code in (R.SEND_MESSAGE, R.SEND_MESSAGE_V2):
        return b"edge"
    if code == R.SEND_BATCH_MESSAGE:
        return b""  # a batch body is made by the test (it is not a header field)
    return b""


def valid_request(code: int, names_index: int = 0) -> tuple[dict, bytes]:
    """A header with every field set to a valid value, under its `names_index`-th name (the
    V2 letter for sends with 1)."""
    ext = {}
    for field in SPECS[code].fields:
        name = field.names[min(names_index, len(field.names) - 1)]
        ext[name] = _sample(code, field)
    if code in (R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE):
        ext[field_name(code, "queue_id", names_index)] = "0"
    return ext, _body(code)


def field_name(code: int, attr: str, names_index: int = 0) -> str:
    for field in SPECS[code].fields:
        if field.attr == attr:
            return field.names[min(names_index, len(field.names) - 1)]
    raise KeyError(attr)


@dataclass(frozen=True)
class Case:
    code: int
    names: tuple[str, ...]
    what: str
    ext: dict
    body: bytes
    refused: bool

    @property
    def id(self) -> str:
        return f"{self.code}-{self.names[0]}-{self.what}"


def _bad_values(field) -> list[tuple[str, str, bool]]:
    """(what, text, must be refused) for one field's kind."""
    kind = field.kind
    if isinstance(kind, Int):
        lo, hi = kind.bounds()
        out = [("not-numeric", "12x", True), ("empty", "", True), ("spaces", " 1", True),
               ("over-max", str(hi + 1), True), ("under-min", str(lo - 1), True),
               ("huge", "9" * 20, True), ("negative", "-1", kind.min is not None and kind.min > -1)]
        if kind.bits == 32:
            out.append(("over-int32", str(2**31), True))
        return out
    if isinstance(kind, Name):
        out = [("huge", "N" * (kind.max_chars + 1), True), ("newline", "EdgeN\n", True),
               ("bad-chars", "a b", True)]
        if not kind.allow_empty:
            out.append(("empty", "", True))
        return out
    if isinstance(kind, Text):
        return [("huge", "x" * (kind.max_chars + 1), True)]
    if isinstance(kind, Choice):
        return [("not-a-choice", "NOPE", True)]
    return [("odd", "maybe", False)]  # Bool: anything but true/1 reads as false


def _other_valid(field, value: str) -> str:
    """A valid value of the field's kind that differs from `value`."""
    if isinstance(field.kind, Bool):
        return "true" if value != "true" else "false"
    if isinstance(field.kind, Int):
        return "1" if value != "1" else "2"
    return "EdgeOther" if value != "EdgeOther" else "EdgeOther2"


def field_cases() -> list[Case]:
    out = []
    for code, spec in sorted(SPECS.items()):
        for field in spec.fields:
            ext, body = valid_request(code)
            name = field.names[0]
            if field.required:
                missing = {k: v for k, v in ext.items() if k not in field.names}
                out.append(Case(code, field.names, "missing", missing, body, True))
            for what, text, refused in _bad_values(field):
                out.append(Case(code, field.names, what, {**ext, name: text}, body, refused))
            if len(field.names) > 1:  # the same field under its other name, another value
                dup = {**ext, field.names[1]: _other_valid(field, ext[name])}
                out.append(Case(code, field.names, "duplicate", dup, body, True))
    return out
