"""Handing a failed message back to the broker: CONSUMER_SEND_MSG_BACK (36)
(docs/messaging.md, Retry and dead letters). The broker stores a copy in %RETRY%<group> after
a growing delay (delay level 3 + reconsume times unless `delay_level` says otherwise), or in
%DLQ%<group> once the message was reconsumed `max_reconsume_times` times (or with delay_level < 0).

Retry copies come back through the group's retry topic, which every clustering consumer
subscribes to; `restore_topic` gives them their original topic (property RETRY_TOPIC), as
Java's consumer does, so the listener sees the topic it subscribed to.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tidemq.protocol.codes import RequestCode

if TYPE_CHECKING:
    from tidemq.instance import ClientInstance
    from tidemq.message import MessageExt

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
PROP_RETRY_TOPIC = "RETRY_TOPIC"


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


async def send_back(instance: ClientInstance, addr: str, msg: MessageExt, group: str, *,
                    delay_level: int = 0, max_reconsume_times: int = 16,
                    timeout_s: float = 3.0) -> None:
    """Raise the catalogue error when the broker did not take it (the caller retries locally)."""
    ext = {"offset": str(msg.physical_offset), "group": group, "delayLevel": str(delay_level),
           "originMsgId": msg.msg_id, "originTopic": msg.topic,
           "maxReconsumeTimes": str(max_reconsume_times)}
    await instance.call(addr, RequestCode.CONSUMER_SEND_MSG_BACK, ext, timeout_s=timeout_s,
                        what=f"send back {msg.msg_id}")


def restore_topic(msgs: Iterable[MessageExt]) -> None:
    """Retry copies: show the original topic (see the module docstring)."""
    for m in msgs:
        origin = m.get_property(PROP_RETRY_TOPIC)
        if origin:
            m.topic_override = origin
