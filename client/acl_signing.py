"""RocketMQ ACL 1.0 request signing (docs/protocol.md, ACL signatures). Pure, stdlib only.

The broker side (node/security/acl/) checks with the same `signature()`, so both ends agree by
construction; tests also check it against the unmodified `rocketmq` (cpp) client.

Signed content:
1. every ext field except `Signature`, sorted by key (byte order: Java's TreeMap order for
   ASCII keys), values only, concatenated with no separator, as UTF-8;
2. then the raw body bytes.
Signature = standard base64 (padded) of HMAC-SHA1(key = UTF-8 secret, content).

Rules:
1. A `Credentials` never shows its secret: repr() and str() print the access key only, so a
   config dump or a log line of a client config cannot leak it.
2. Signing adds `AccessKey` (and `SecurityToken` when set) before computing the signature, so
   both are covered, as Java's AclClientRPCHook does.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Container, Mapping
from dataclasses import dataclass, field

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str = field(repr=False)
    security_token: str = ""

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("credentials need a non-empty access key and secret key")

    def __str__(self) -> str:
        return f"Credentials(access_key={self.access_key!r}, secret_key=***)"

    __repr__ = __str__


def signature_content(ext: Mapping[str, str], body: bytes,
                      skip: Container[str] = (SIGNATURE,)) -> bytes:
    """The bytes that are signed: sorted ext values (minus `skip` keys) + body."""
    values = "".join([ext[k] for k in sorted(ext) if k not in skip])
    raw = values.encode("utf-8", "replace")
    if not body:
        return raw
    return raw + (body if body.__class__ is bytes else bytes(body))


def signature(secret_key: str, content: bytes) -> str:
    # hmac.digest: OpenSSL's one-shot HMAC, about a third cheaper than hmac.new(...).digest()
    return base64.b64encode(hmac.digest(secret_key.encode("utf-8"), content, "sha1")).decode("ascii")


def sign_ext(ext: Mapping[str, str | None], body: bytes, creds: Credentials) -> dict[str, str]:
    """A copy of ext with AccessKey, SecurityToken and Signature added (rule 2). Values must
    already be strings (as on the wire)."""
    out = {k: v for k, v in ext.items() if v is not None and k != SIGNATURE}
    out[ACCESS_KEY] = creds.access_key
    if creds.security_token:
        out[SECURITY_TOKEN] = creds.security_token
    out[SIGNATURE] = signature(creds.secret_key, signature_content(out, body))
    return out


__all__ = ["Credentials", "signature_content", "signature", "sign_ext", "ACCESS_KEY", "SIGNATURE",
           "SECURITY_TOKEN"]
