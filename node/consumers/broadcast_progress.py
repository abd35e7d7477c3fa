"""Broadcast consumers' progress kept on the broker, per (group, client id).

RocketMQ keeps broadcasting offsets only in a file on each consumer's machine
(LocalFileOffsetStore.java): lost with the machine, invisible to operators. TideMQ clients also
send them to the broker: QUERY_CONSUMER_OFFSET (14) and UPDATE_CONSUMER_OFFSET (15) with the extra
header field `broadcastClientId`. They are stored in the ordinary consumer-offset table (so they
are persisted and replicated with it) under the group name "<group>@<client id>": '@' never
appears in a group name (node/topics.group_name_ok), so the pair splits unambiguously.
"""
from __future__ import annotations

EXT_CLIENT_ID = "broadcastClientId"
CLIENT_ID_MAX_CHARS = 1024  # as node/processors/client_manage.py


class BadClientId(ValueError):
    pass


def member_key(group: str, client_id: str | None) -> str:
    """The table's group name: `group` itself for clustering, "<group>@<client id>" else."""
    if client_id is None:
        return group
    if not client_id or len(client_id) > CLIENT_ID_MAX_CHARS or not client_id.isprintable():
        raise BadClientId(f"bad {EXT_CLIENT_ID}: 1-{CLIENT_ID_MAX_CHARS} printable characters")
    return f"{group}@{client_id}"


def split_member(key: str) -> tuple[str, str | None]:
    """(group, client id or None) of a table group name."""
    group, sep, client_id = key.partition("@")
    return (group, client_id) if sep else (key, None)
