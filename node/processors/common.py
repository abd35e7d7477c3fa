"""Helpers every processor uses: responses, Java's remarks, subscription expressions.

Response ext values are always strings, never empty numeric strings, and extFields is always
present (cpp and Go read nothing else; docs/protocol.md, Header value typing): build ext dicts
of str values only.
"""
from __future__ import annotations

from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.jhash import java_string_hash
from tidemq.protocol.remoting import RemotingCommand

FAQ_SUFFIX = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."
SUB_ALL = "*"
_TAG_CACHE_MAX = 4096
_tag_cache: dict[str, frozenset | None] = {}


def ok(request, ext=None, body=b"") -> RemotingCommand:
    return RemotingCommand.make_response(request, 0, ext, body)


def error(request, code: int, remark: str) -> RemotingCommand:
    return RemotingCommand.make_response(request, int(code), remark=remark)


def not_writable(repl, request) -> RemotingCommand | None:
    """SERVICE_NOT_AVAILABLE when this broker may not change replicated state now (a slave, or
    a master short of in-sync replicas), else None: operator changes check it first. `repl` is
    the node's Replication, None when it does not replicate."""
    refusal = None if repl is None else repl.write_refusal()
    if refusal is None:
        return None
    return error(request, ResponseCode.SERVICE_NOT_AVAILABLE, f"nothing changed: {refusal}")


def topic_not_exist_remark(topic: str) -> str:
    return f"topic[{topic}] not exist, apply first please!{FAQ_SUFFIX}"


def tag_codes(expression: str | None) -> frozenset | None:
    """Tag hash codes of a TAG expression "tagA || tagB"; None means every message ("*",
    empty). Java's FilterAPI.buildSubscriptionData, cached: expressions repeat on every pull."""
    if not expression:
        return None
    try:
        return _tag_cache[expression]
    except KeyError:
        pass
    codes: frozenset | None
    text = expression.strip()
    if not text or text == SUB_ALL:
        codes = None
    else:
        tags = [t.strip() for t in text.split("||")]
        codes = frozenset(java_string_hash(t) for t in tags if t) or None
    if len(_tag_cache) >= _TAG_CACHE_MAX:
        _tag_cache.clear()
    _tag_cache[expression] = codes
    return codes


def subscription_codes(sub) -> frozenset | None:
    """Tag codes of a registered (heartbeat) SubscriptionData, codes recomputed from tags."""
    if sub.sub_string.strip() in ("", SUB_ALL) or not sub.tags_set:
        return None
    return frozenset(sub.code_set)
