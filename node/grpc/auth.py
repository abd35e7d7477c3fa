"""ACL for gRPC requests: the accounts and permissions of the remoting ACL file
(node/security/acl/, security.acl_enable), with the RocketMQ 5 SDKs' signature.

The SDKs send metadata `authorization: MQv2-HMAC-SHA1 Credential=<AccessKey>,
SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(SecretKey, x-mq-date-time)>`.

Rules (the remoting validator's order):
1. a peer in the global white list passes; an empty Credential is anonymous (the file's
   [anonymous] table, else refused); an unknown AccessKey, a peer outside the account's
   allowed addresses, or a wrong signature is refused: UNAUTHORIZED.
2. each resource the method needs must be permitted (DENY wins; internal topics are for admin
   accounts only; an admin account without explicit permissions may do everything): else
   FORBIDDEN. Sends and EndTransaction need topic PUB; receives, acks, invisibility changes,
   dead-lettering and assignments need topic SUB and group SUB; routes, heartbeats and
   telemetry need a valid signature only.
3. The signed date-time is the client's local time (the SDK sends no zone), so it is not
   checked for freshness: with ACL on, use TLS so a captured header cannot be replayed.
Refusal messages name the AccessKey and the resource, never a secret or a signature.
"""
from __future__ import annotations

import hashlib
import hmac
import re

from tidemq.node.security.acl.accounts import perm_name
from tidemq.node.security.acl.resources import GROUP, is_internal_topic, topic_resource
from tidemq.node.security.acl.validator import has_perm

_AUTH = re.compile(r"^MQv2-HMAC-SHA1 Credential=([^,]*), SignedHeaders=x-mq-date-time, "
                   r"Signature=([0-9a-fA-F]+)$")
_SHOWN_KEY_CHARS = 64
UNAUTHORIZED, FORBIDDEN = 40100, 40300


def peer_ip(context) -> str:
    peer = context.peer() or ""
    host = peer.split(":", 1)[1].rsplit(":", 1)[0] if ":" in peer else peer
    return host.strip("[]")


class GrpcAuth:
    def __init__(self, validator):
        self.validator = validator  # node/security/acl/validator.py AclValidator: its table and reload

    def check(self, context, topic: str | None = None, group: str | None = None,
              topic_perm: int = 0) -> tuple[int, str] | None:
        """None when allowed, else (Code, message). topic_perm: PUB or SUB (with the group)."""
        v = self.validator
        v.maybe_reload()
        table = v.table
        ip = peer_ip(context)
        if table.global_white and table.global_white.matches(ip):
            return None
        meta = dict(context.invocation_metadata() or ())
        m = _AUTH.match(meta.get("authorization", ""))
        key = m.group(1) if m else ""
        account = table.accounts.get(key) if key else table.anonymous
        who = f"AccessKey {key[:_SHOWN_KEY_CHARS]!r}" if key else "anonymous"
        if account is None:
            return UNAUTHORIZED, (f"[ACL] unknown {who}" if key else
                                  "[ACL] anonymous requests are not allowed: sign requests "
                                  "with an AccessKey")
        if not account.allowed.matches(ip):
            return UNAUTHORIZED, f"[ACL] {who} may not be used from {ip}"
        if key:
            expected = hmac.new(account.secret_key.encode(), meta.get("x-mq-date-time", "")
                                .encode(), hashlib.sha1).hexdigest()
            if not hmac.compare_digest(expected, m.group(2).lower()):
                return UNAUTHORIZED, f"[ACL] signature mismatch for {who}"
        if not topic_perm or (account.admin and not account.topic_perms
                              and not account.group_perms):
            return None
        wanted = [topic_resource(topic or "", topic_perm)]
        if group is not None:
            wanted.append((GROUP, group, topic_perm))
        for kind, name, perm in wanted:
            if kind != GROUP and is_internal_topic(name) and not account.admin:
                return FORBIDDEN, f"[ACL] {who} may not use internal topic {name!r}"
            owned = account.group_perm(name) if kind == GROUP else account.topic_perm(name)
            if not has_perm(perm, owned):
                return (FORBIDDEN,
                        f"[ACL] {who} has no {perm_name(perm)} permission on {kind} {name!r}")
        return None
