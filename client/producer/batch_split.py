"""Cutting a list of messages into batch sends the broker takes: at most `max_messages`
messages and `max_bytes` of batch body each (the broker answers 13 MESSAGE_ILLEGAL otherwise;
docs/limits.md, Messages and batches).

Producer.send_batch refuses an oversize batch rather than splitting it, because a batch is one
request stored as a whole or not at all, and a silent split would give the caller several
independent outcomes for what they sent as one. Callers that want many messages sent in
batches cut the list first (Producer.split_batch, as RocketMQ's Java users do with a
ListSplitter) and send each part.

Rules:
1. Parts keep the messages' order and are filled greedily: a new part starts when the next
   message would pass either cap.
2. One message bigger than `max_bytes` by itself cannot be sent in any batch: IllegalArgument.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from tidemq import errors

M = TypeVar("M")

DEFAULT_MAX_BATCH_MESSAGES = 512  # the broker's max_batch_messages default


def split_batches(msgs: Iterable[M], max_messages: int, max_bytes: int,
                  entry_bytes: Callable[[M], int]) -> list[list[M]]:
    """`msgs` as consecutive lists within both caps; `entry_bytes(msg)` is the size of the
    message's entry in the batch body."""
    parts: list[list[M]] = []
    part: list[M] = []
    part_bytes = 0
    for msg in msgs:
        size = entry_bytes(msg)
        if size > max_bytes:
            raise errors.IllegalArgument(f"a message's batch entry is {size} bytes, over the "
                                         f"batch limit of {max_bytes}: send it alone")
        if part and (len(part) >= max_messages or part_bytes + size > max_bytes):
            parts.append(part)
            part, part_bytes = [], 0
        part.append(msg)
        part_bytes += size
    if part:
        parts.append(part)
    return parts
