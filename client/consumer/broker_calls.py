"""Consumer-side broker calls shared by the push and pull consumers: PULL_MESSAGE (11), offsets
(14, 15, 29, 30, 31, 9003), a group's progress (208, paged), consumer ids (38), and tag
expressions.

Pull outcomes (docs/protocol.md, Pull) become a PullResult status, never an exception:

    0  SUCCESS                 FOUND          records in the body
    19 PULL_NOT_FOUND          NO_NEW_MSG     caught up; next = nextBeginOffset
    20 PULL_RETRY_IMMEDIATELY  NO_MATCHED_MSG everything in range filtered out
    21 PULL_OFFSET_MOVED       OFFSET_ILLEGAL offset outside [min, max]; next = corrected one

Any other code raises its catalogue error (client.errors).

Rules:
1. Records are split, not decoded (client.message.split_records); with a tag subscription each
   record is decoded once to re-filter by the exact tag (the broker filters by tag hash,
   which can collide). An SQL92 subscription (client/consumer/selector.py) travels with its
   expressionType and is matched by the broker alone.
2. A FOUND reply whose body holds no matching record is reported as NO_MATCHED_MSG with the
   broker's nextBeginOffset, so callers always advance exactly where the broker said.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from tidemq import errors
from tidemq.message import MessageExt, split_records
from tidemq.protocol.codes import PullSysFlag, RequestCode, ResponseCode

if TYPE_CHECKING:
    from tidemq.consumer.selector import SubscriptionFilter
    from tidemq.instance import ClientInstance
    from tidemq.topic_routes import MessageQueue


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


_STATUS: dict[int, PullStatus] = {ResponseCode.SUCCESS: PullStatus.FOUND,
           ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
           ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
           ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL}


def status_of(code: int) -> PullStatus | None:
    """The pull outcome of a response code; None when the code is an error."""
    return _STATUS.get(code)


class PullResult:
    __slots__ = ("status", "next_begin_offset", "min_offset", "max_offset", "messages",
                 "suggest_broker_id")

    def __init__(self, status: PullStatus, next_begin_offset: int, min_offset: int, max_offset: int,
                 messages: list[MessageExt], suggest_broker_id: int = 0) -> None:
        self.status = status
        self.next_begin_offset = next_begin_offset
        self.min_offset = min_offset
        self.max_offset = max_offset
        self.messages = messages
        self.suggest_broker_id = suggest_broker_id

    def __repr__(self) -> str:
        return (f"PullResult({self.status.name}, next={self.next_begin_offset}, "
                f"min={self.min_offset}, max={self.max_offset}, messages={len(self.messages)})")


class TagFilter:
    """A TAG subscription expression: "*" (or empty) = everything, else "a || b || c"."""

    __slots__ = ("expression", "tags", "sub_version")
    expression_type = "TAG"

    def __init__(self, expression: str | None = "*") -> None:
        expression = (expression or "*").strip()
        self.expression = expression
        self.tags: frozenset[str] | None
        if expression == "*":
            self.tags = None
        else:
            self.tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
            if not self.tags:
                raise errors.IllegalArgument(f"bad tag expression {expression!r}")
        self.sub_version = int(time.time() * 1000)

    @property
    def matches_all(self) -> bool:
        return self.tags is None

    def matches(self, msg: MessageExt) -> bool:
        return self.tags is None or msg.tags in self.tags

    def tag_list(self) -> list[str]:
        return sorted(self.tags) if self.tags else []


def _int(ext: Mapping[str, str], key: str, default: int = -1) -> int:
    value = ext.get(key)
    try:
        return int(value) if value is not None else default
    except ValueError:
        raise errors.ProtocolViolation(f"pull reply field {key}={value!r} is not an integer") from None


async def pull(instance: ClientInstance, addr: str, mq: MessageQueue, offset: int, *, group: str,
               tag_filter: SubscriptionFilter, max_nums: int = 32, suspend_ms: int = 0,
               timeout_s: float = 10.0, commit_offset: int | None = None) -> PullResult:
    """One PULL_MESSAGE. suspend_ms > 0 sets SUSPEND (long poll); commit_offset sets COMMIT_OFFSET."""
    sys_flag = PullSysFlag.SUBSCRIPTION
    if suspend_ms > 0:
        sys_flag |= PullSysFlag.SUSPEND
    if commit_offset is not None and commit_offset > 0:
        sys_flag |= PullSysFlag.COMMIT_OFFSET
    ext = {"consumerGroup": group, "topic": mq.topic, "queueId": str(mq.queue_id),
           "queueOffset": str(offset), "maxMsgNums": str(max_nums), "sysFlag": str(int(sys_flag)),
           "commitOffset": str(commit_offset if commit_offset and commit_offset > 0 else 0),
           "suspendTimeoutMillis": str(suspend_ms), "subscription": tag_filter.expression,
           "subVersion": str(tag_filter.sub_version), "expressionType": tag_filter.expression_type}
    cmd = instance.remoting.command(RequestCode.PULL_MESSAGE, ext)
    resp = await instance.remoting.invoke(addr, cmd, timeout_s)
    status = _STATUS.get(resp.code)
    if status is None:
        raise errors.error_for_response(resp, addr=addr, what=f"pull {mq}")
    ext = resp.ext
    result = PullResult(status, _int(ext, "nextBeginOffset", offset), _int(ext, "minOffset"),
                        _int(ext, "maxOffset"), [], _int(ext, "suggestWhichBrokerId", 0))
    if status is PullStatus.FOUND:
        msgs: list[MessageExt] = split_records(resp.body, mq.broker_name) if resp.body else []
        if not tag_filter.matches_all:
            msgs = [m for m in msgs if tag_filter.matches(m)]
        result.messages = msgs
        if not msgs:
            result.status = PullStatus.NO_MATCHED_MSG  # rule 2
    return result


async def query_consumer_offset(instance: ClientInstance, addr: str, group: str, mq: MessageQueue,
                                timeout_s: float = 5.0) -> int:
    """The committed offset, or -1 if the broker has none (22 QUERY_NOT_FOUND)."""
    ext = {"consumerGroup": group, "topic": mq.topic, "queueId": str(mq.queue_id)}
    resp = await instance.call(addr, RequestCode.QUERY_CONSUMER_OFFSET, ext, timeout_s=timeout_s,
                               what=f"query offset {mq}",
                               ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        return -1
    return _int(resp.ext, "offset")


async def update_consumer_offset(instance: ClientInstance, addr: str, group: str,
                                 mq: MessageQueue, offset: int, timeout_s: float = 3.0) -> None:
    ext = {"consumerGroup": group, "topic": mq.topic, "queueId": str(mq.queue_id),
           "commitOffset": str(offset)}
    await instance.call(addr, RequestCode.UPDATE_CONSUMER_OFFSET, ext, timeout_s=timeout_s,
                        what=f"commit offset {mq}")


OFFSET_BATCH_QUEUES = 4096  # rows in one 9003 (the broker's bound)


async def update_consumer_offsets(instance: ClientInstance, addr: str, group: str,
                                  rows: list[tuple[str, int, int]],
                                  timeout_s: float = 5.0) -> None:
    """UPDATE_CONSUMER_OFFSET_BATCH (9003): [(topic, queue id, offset)] of one broker, at most
    OFFSET_BATCH_QUEUES. Raises RequestCodeNotSupported from a broker without it."""
    body = json.dumps({"offsets": rows}, separators=(",", ":")).encode()
    await instance.call(addr, RequestCode.UPDATE_CONSUMER_OFFSET_BATCH, {"consumerGroup": group},
                        body, timeout_s=timeout_s, what=f"commit {len(rows)} offsets")


async def queue_offset(instance: ClientInstance, addr: str, mq: MessageQueue,
                       which: Literal["max", "min", "search"], timestamp_ms: int | None = None,
                       timeout_s: float = 3.0) -> int:
    """which: "max" (30), "min" (31) or "search" (29, by store timestamp)."""
    code = {"max": RequestCode.GET_MAX_OFFSET, "min": RequestCode.GET_MIN_OFFSET,
            "search": RequestCode.SEARCH_OFFSET_BY_TIMESTAMP}[which]
    ext = {"topic": mq.topic, "queueId": str(mq.queue_id)}
    if which == "search":
        assert timestamp_ms is not None, "a search needs timestamp_ms"
        ext["timestamp"] = str(int(timestamp_ms))
    resp = await instance.call(addr, code, ext, timeout_s=timeout_s, what=f"{which} offset {mq}")
    return _int(resp.ext, "offset")


async def consumer_ids(instance: ClientInstance, addr: str, group: str,
                       timeout_s: float = 5.0) -> list[str]:
    """GET_CONSUMER_LIST_BY_GROUP (38): the member ids exactly as the broker has them."""
    resp = await instance.call(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group},
                               timeout_s=timeout_s, what=f"consumers of {group!r}")
    try:
        ids = json.loads(bytes(resp.body).decode("utf-8")).get("consumerIdList") or []
    except (ValueError, AttributeError) as exc:
        raise errors.ProtocolViolation(f"bad consumer list from {addr}: {exc}") from None
    return [str(i) for i in ids]


class QueueProgress:
    """One queue in a group's progress: committed offset (-1 = none), min and max offsets."""
    __slots__ = ("committed", "min_offset", "max_offset")

    def __init__(self, committed: int, min_offset: int, max_offset: int) -> None:
        self.committed = committed
        self.min_offset = min_offset
        self.max_offset = max_offset


PROGRESS_PAGE_QUEUES = 8192  # queues per 208 page: about 1.5 MB of reply
Progress = dict[tuple[str, str, int], QueueProgress]


async def group_progress(instance: ClientInstance, addr: str, group: str,
                         timeout_s: float = 10.0) -> Progress:
    """GET_CONSUME_STATS (208) without a topic: every queue of the topics the group subscribes
    to on addr, keyed (topic, broker name, queue id); {} when the broker knows none of them.
    Read in pages of PROGRESS_PAGE_QUEUES; a broker that does not page answers all at once."""
    out: Progress = {}
    start: int | None = 0
    while start is not None:
        ext = {"consumerGroup": group, "pageStart": str(start),
               "pageSize": str(PROGRESS_PAGE_QUEUES)}
        resp = await instance.call(addr, RequestCode.GET_CONSUME_STATS, ext,
                                   timeout_s=timeout_s, what=f"progress of {group!r}",
                                   ok=(ResponseCode.SUCCESS,
                                       ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST))
        if resp.code != ResponseCode.SUCCESS:
            return out
        start = _progress_page(addr, bytes(resp.body), start, out)
    return out


def _progress_page(addr: str, body: bytes, start: int, out: Progress) -> int | None:
    """Add one 208 reply's rows to out; the next page's start, None after the last page."""
    try:
        doc = json.loads(body.decode("utf-8"))
        for key, row in doc["offsetTable"].items():
            mq = json.loads(key)
            out[(mq["topic"], mq["brokerName"], int(mq["queueId"]))] = QueueProgress(
                int(row["consumerOffset"]), int(row.get("minOffset", 0)), int(row["brokerOffset"]))
        following = doc.get("nextPageStart")
        if following is not None and int(following) <= start:
            raise ValueError(f"next page {following} does not follow {start}")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise errors.ProtocolViolation(f"bad consume stats from {addr}: {exc}") from None
    return None if following is None else int(following)
