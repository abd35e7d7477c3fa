"""TLS contexts for every TideMQ port (remoting, admin HTTP, HA, name servers). Standard library only.

One helper for both ends so that every server and client in the project makes the same choices:
1. TLS 1.2 at least; Python's default cipher list (no RC4/3DES/NULL).
2. Servers present `cert_file` + `key_file`. With `ca_file` they also ask for a client
   certificate, and with `require_client_cert` they refuse a peer without one (mutual TLS,
   meant for HA links and name servers).
3. Clients verify the server against `ca_file` (or the system store when empty) and check the
   host name (the development CA from `tidemq certs` puts 127.0.0.1 and localhost in the SAN).
4. A missing or unreadable file is a TlsConfigError naming the file, never a traceback, and
   never the key's contents.
5. `cert_not_after` reads when a PEM certificate expires (the first one in the file: the
   node's own, ahead of its chain); the ssl module loads expired certificates silently.
"""

from __future__ import annotations

import base64
import calendar
import os
import re
import ssl
import time
from dataclasses import dataclass

_PEM_CERT = re.compile(r"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL)
_UTC_TIME, _GENERALIZED_TIME = 0x17, 0x18


class TlsConfigError(ValueError):
    pass


def _check_file(kind: str, path: str) -> None:
    if not path:
        raise TlsConfigError(f"TLS {kind} file is not set")
    if not os.path.isfile(path):
        raise TlsConfigError(f"TLS {kind} file {path!r} does not exist")


def server_context(cert_file: str, key_file: str, ca_file: str = "",
                   require_client_cert: bool = False) -> ssl.SSLContext:
    _check_file("certificate", cert_file)
    _check_file("key", key_file)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(f"cannot load TLS certificate {cert_file!r} / key {key_file!r}: "
                             f"{exc.__class__.__name__}") from None
    if ca_file:
        _load_ca(ctx, ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    elif require_client_cert:
        raise TlsConfigError("mutual TLS needs a CA file to verify client certificates")
    return ctx


def client_context(ca_file: str = "", cert_file: str = "", key_file: str = "",
                   check_hostname: bool = True) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = check_hostname
    if ca_file:
        _load_ca(ctx, ca_file)
    else:
        ctx.load_default_certs()
    if cert_file or key_file:
        _check_file("client certificate", cert_file)
        _check_file("client key", key_file)
        try:
            ctx.load_cert_chain(cert_file, key_file)
        except (ssl.SSLError, OSError) as exc:
            raise TlsConfigError(f"cannot load TLS client certificate {cert_file!r}: "
                                 f"{exc.__class__.__name__}") from None
    return ctx


def _load_ca(ctx: ssl.SSLContext, ca_file: str) -> None:
    _check_file("CA", ca_file)
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(f"cannot load TLS CA file {ca_file!r}: "
                             f"{exc.__class__.__name__}") from None


def _der_items(der: bytes, pos: int, end: int) -> list[tuple[int, int, int]]:
    """The (tag, value start, value end) of each DER element in der[pos:end]."""
    items = []
    while pos < end:
        tag, size = der[pos], der[pos + 1]
        pos += 2
        if size & 0x80:  # long form: the next (size & 0x7F) bytes hold the length
            n = size & 0x7F
            size = int.from_bytes(der[pos:pos + n], "big")
            pos += n
        if pos + size > end:
            raise ValueError("truncated DER element")
        items.append((tag, pos, pos + size))
        pos += size
    return items


def cert_not_after(path: str) -> float:
    """The notAfter of the first certificate in the PEM file `path`, as a Unix time (rule 5).
    Raises TlsConfigError when the file holds no readable certificate."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            match = _PEM_CERT.search(f.read())
        der = base64.b64decode("".join(match.group(1).split())) if match else b""
        cert = _der_items(der, 0, len(der))[0]
        tbs = _der_items(der, cert[1], cert[2])[0]
        fields = _der_items(der, tbs[1], tbs[2])
        if fields[0][0] == 0xA0:  # [0] version, absent in v1 certificates
            fields = fields[1:]
        tag, start, end = _der_items(der, fields[3][1], fields[3][2])[1]  # validity.notAfter
        text = der[start:end].decode("ascii")
        form = {_UTC_TIME: "%y%m%d%H%M%SZ", _GENERALIZED_TIME: "%Y%m%d%H%M%SZ"}[tag]
        return float(calendar.timegm(time.strptime(text, form)))
    except (OSError, ValueError, IndexError, KeyError) as exc:
        raise TlsConfigError(f"cannot read the expiry of TLS certificate {path!r}: "
                             f"{exc.__class__.__name__}") from None


@dataclass(frozen=True)
class TlsFiles:
    """The file names one end needs; `server()` / `client()` build the context."""
    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    require_client_cert: bool = False

    def server(self) -> ssl.SSLContext:
        return server_context(self.cert_file, self.key_file, self.ca_file,
                              self.require_client_cert)

    def client(self, check_hostname: bool = True) -> ssl.SSLContext:
        return client_context(self.ca_file, self.cert_file, self.key_file, check_hostname)


__all__ = ["TlsConfigError", "TlsFiles", "cert_not_after", "client_context", "server_context"]
