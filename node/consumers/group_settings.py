"""Subscription-group settings: RocketMQ's SubscriptionGroupConfig fields, their kinds, ranges
and defaults, and the check every incoming config passes (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
bodies, the settings files, replicated records).

A config is a dict in Java's JSON form:

    {"groupName": G, "consumeEnable": true, "consumeFromMinEnable": true,
     "consumeBroadcastEnable": true, "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0,
     "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": true}

Rules:
1. groupName follows the group name rules (node/topics.py group_name_ok): the topic
   character set `^[%|a-zA-Z0-9_-]+$`, 1..255 characters.
2. Flags are JSON booleans; numbers are JSON integers (not booleans, not floats) in the ranges
   of FIELDS. A field left out keeps its current value (the group's stored config, else the
   defaults); fields this table does not name (newer RocketMQ versions add some) are ignored.
3. Applied: consumeEnable (pulls), consumeBroadcastEnable (broadcasting pulls), retryMaxTimes
   (send-back, when the client names no maximum itself). The others are stored and reported.
"""
from __future__ import annotations

from tidemq.node.topics import GROUP_MAX_CHARS, group_name_ok

I32_MAX, I64_MAX = 2**31 - 1, 2**63 - 1

# Java name -> (python type, min, max); booleans carry no range.
FIELDS: dict[str, tuple[type, int, int]] = {
    "consumeEnable": (bool, 0, 0),
    "consumeFromMinEnable": (bool, 0, 0),
    "consumeBroadcastEnable": (bool, 0, 0),
    "notifyConsumerIdsChangedEnable": (bool, 0, 0),
    "retryQueueNums": (int, 0, 1024),
    "retryMaxTimes": (int, 0, I32_MAX),
    "brokerId": (int, 0, I64_MAX),
    "whichBrokerWhenConsumeSlowly": (int, 0, I64_MAX),
}


class SettingsError(ValueError):
    """A config that breaks rules 1-2; str() is the remark for the client (it quotes no more
    than a bounded part of the client's input)."""


def defaults(group: str, retry_max_times: int) -> dict:
    """Java's defaults, with the broker's max_reconsume_times as retryMaxTimes."""
    return {"groupName": group, "consumeEnable": True, "consumeFromMinEnable": True,
            "consumeBroadcastEnable": True, "retryQueueNums": 1, "retryMaxTimes": retry_max_times,
            "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1,
            "notifyConsumerIdsChangedEnable": True}


def check_group(doc) -> str:
    """The config's group name (rule 1)."""
    if not isinstance(doc, dict):
        raise SettingsError("bad subscription group config: the body must be a JSON object")
    group = doc.get("groupName")
    if not isinstance(group, str) or not group_name_ok(group):
        shown = "is missing; it" if group is None else (
            repr(group[:64]) if isinstance(group, str) else f"(a {type(group).__name__})")
        raise SettingsError(f"bad subscription group config: groupName {shown} must be 1.."
                            f"{GROUP_MAX_CHARS} characters of ^[%|a-zA-Z0-9_-]+$")
    return group


def checked_changes(doc) -> dict:
    """The named fields of `doc`, each checked (rule 2); groupName included."""
    out = {"groupName": check_group(doc)}
    for name, (kind, lo, hi) in FIELDS.items():
        if name not in doc:
            continue
        value = doc[name]
        if kind is bool:
            if not isinstance(value, bool):
                raise SettingsError(f"bad subscription group config: {name} must be true or false")
        elif isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise SettingsError(f"bad subscription group config: {name} must be an integer in "
                                f"{lo}..{hi}")
        out[name] = value
    return out


def merged(current: dict, changes: dict) -> dict:
    """`current` with `changes` applied: a complete config."""
    return {**current, **changes}
