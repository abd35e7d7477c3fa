"""Client-side security: request signing (ACL 1.0) and TLS for every SDK connection.

    from tidemq.security import ClientSecurity, load_credentials
    sec = ClientSecurity(credentials=load_credentials("creds.toml"), tls_ca_file="ca.pem")
    Producer("g", "127.0.0.1:10911", security=sec)

Rules:
1. Secrets come from a file or the environment, never from a command line: `load_credentials`
   reads a TOML file (`access_key`, `secret_key`, optional `security_token`) or the variables
   TIDEMQ_ACCESS_KEY / TIDEMQ_SECRET_KEY; TIDEMQ_CREDENTIALS_FILE names the file.
2. `sign_head` signs any pre-encoded request frame head (the producer's fast send templates
   included), so one hook in the connection covers every request the SDK writes.
3. The CLI sets a process default (`set_default`); an explicit `security=` option wins.
"""

from __future__ import annotations

import json
import os
import ssl
import struct
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_str  # C-accelerated
from typing import Any

from tidemq.acl_signing import ACCESS_KEY, SECURITY_TOKEN, SIGNATURE, Credentials, sign_ext
from tidemq.protocol.codes import SerializeType
from tidemq.protocol.remoting import decode_frame, encode_frame_head
from tidemq.tls import client_context

_loads: Callable[[bytes], Any] = json.loads
try:
    import orjson
    _loads = orjson.loads
except ImportError:  # optional speed-up, as in client.protocol.remoting
    pass


_PREFIX = struct.Struct(">iI")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
ENV_ACCESS_KEY = "TIDEMQ_ACCESS_KEY"
ENV_SECRET_KEY = "TIDEMQ_SECRET_KEY"
ENV_CREDENTIALS_FILE = "TIDEMQ_CREDENTIALS_FILE"
ENV_TLS = "TIDEMQ_TLS"  # "1" = connect with TLS (system CAs unless TIDEMQ_TLS_CA is set)
ENV_TLS_CA = "TIDEMQ_TLS_CA"
ENV_TLS_CERT = "TIDEMQ_TLS_CERT"
ENV_TLS_KEY = "TIDEMQ_TLS_KEY"


@dataclass(frozen=True)
class ClientSecurity:
    credentials: Credentials | None = None
    tls: bool = False
    tls_ca_file: str = ""
    tls_cert_file: str = ""  # client certificate (mutual TLS), optional
    tls_key_file: str = ""
    tls_check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.tls_ca_file or self.tls_cert_file:
            object.__setattr__(self, "tls", True)

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        ctx = _contexts.get(self)
        if ctx is None:
            ctx = _contexts[self] = client_context(self.tls_ca_file, self.tls_cert_file,
                                                   self.tls_key_file, self.tls_check_hostname)
        return ctx


_contexts: dict[ClientSecurity, ssl.SSLContext] = {}
_default: ClientSecurity | None = None


def set_default(security: ClientSecurity | None) -> None:
    global _default
    _default = security


def default() -> ClientSecurity | None:
    return _default


def sign_head(head: bytes, body: bytes, creds: Credentials) -> bytes:
    """The frame head (length prefix + header) of the same request, signed (rule 2).

    Our encoders (protocol.remoting, send_codec) always write extFields LAST, so the signed
    keys are spliced in before the header's end instead of re-encoding the whole header."""
    length, word = _PREFIX.unpack_from(head, 0)
    header_len = word & 0xFFFFFF
    header = bytes(head[8:8 + header_len])
    is_json = word >> 24 == SerializeType.JSON
    try:
        ext = _loads(header).get("extFields") if is_json else None
    except ValueError:  # e.g. an escaped lone surrogate orjson refuses: the lenient decoder
        ext = None
    if ext is None or not all(v.__class__ is str for v in ext.values()):
        ext = decode_frame(_PREFIX.pack(4 + header_len, word) + header).ext or {}
    if ACCESS_KEY in ext or SIGNATURE in ext or SECURITY_TOKEN in ext:
        cmd = decode_frame(_PREFIX.pack(4 + header_len, word) + header)
        cmd.ext = sign_ext(ext, body, creds)  # already (partly) signed: re-encode it all
        cmd.body = body or b""
        signed_head: bytes = encode_frame_head(cmd)
        return signed_head
    signed = sign_ext(ext, body, creds)
    added = [(k, signed[k]) for k in (ACCESS_KEY, SECURITY_TOKEN, SIGNATURE) if k in signed]
    if is_json:
        assert header.endswith(b"}}"), "extFields must be the last header key"
        pairs = ",".join(f"{_json_str(k)}:{_json_str(v)}" for k, v in added).encode("ascii")
        header = header[:-2] + (b"," if ext else b"") + pairs + b"}}"
    else:  # ROCKETMQ: ... remarkLen i32 @13, remark, extLen i32, ext pairs (last)
        (remark_len,) = _I32.unpack_from(header, 13)
        at = 17 + remark_len
        (ext_len,) = _I32.unpack_from(header, at)
        pairs = b"".join(_I16.pack(len(k)) + k.encode() + _I32.pack(len(v.encode()))
                         + v.encode() for k, v in added)
        header = header[:at] + _I32.pack(ext_len + len(pairs)) + header[at + 4:] + pairs
    new_len = len(header)
    return _PREFIX.pack(length - header_len + new_len, (word & ~0xFFFFFF) | new_len) + header


def load_credentials(path: str | None = None,
                     environ: Mapping[str, str] | None = None) -> Credentials | None:
    """Credentials from `path`, else TIDEMQ_CREDENTIALS_FILE, else TIDEMQ_ACCESS_KEY +
    TIDEMQ_SECRET_KEY; None when none is given. Errors never quote the secret."""
    env = os.environ if environ is None else environ
    path = path or env.get(ENV_CREDENTIALS_FILE, "")
    if path:
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except OSError as exc:
            raise ValueError(f"cannot read credentials file {path!r}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError:
            raise ValueError(f"credentials file {path!r} is not valid TOML") from None
        access, secret = doc.get("access_key"), doc.get("secret_key")
        if not isinstance(access, str) or not isinstance(secret, str) or not access or not secret:
            raise ValueError(f"credentials file {path!r} needs string access_key and secret_key")
        token = doc.get("security_token", "")
        return Credentials(access, secret, token if isinstance(token, str) else "")
    access, secret = env.get(ENV_ACCESS_KEY, ""), env.get(ENV_SECRET_KEY, "")
    if access or secret:
        if not (access and secret):
            raise ValueError(f"set both {ENV_ACCESS_KEY} and {ENV_SECRET_KEY}")
        return Credentials(access, secret)
    return None


def from_environment(credentials_file: str | None = None, tls_ca_file: str | None = None,
                     environ: Mapping[str, str] | None = None) -> ClientSecurity | None:
    """What the CLI uses: credentials (rule 1) and TLS settings from options or environment."""
    env = os.environ if environ is None else environ
    creds = load_credentials(credentials_file, env)
    ca = tls_ca_file or env.get(ENV_TLS_CA, "")
    tls = bool(ca) or env.get(ENV_TLS, "").lower() in ("1", "true", "yes", "on")
    if creds is None and not tls:
        return None
    return ClientSecurity(credentials=creds, tls=tls, tls_ca_file=ca,
                          tls_cert_file=env.get(ENV_TLS_CERT, ""),
                          tls_key_file=env.get(ENV_TLS_KEY, ""))


__all__ = ["ClientSecurity", "Credentials", "load_credentials", "from_environment", "sign_head",
           "set_default", "default"]
