"""One-line errors with a hint for the `tidemq` CLI: every failure an operator commonly meets
becomes `tidemq: <what happened> (hint: <what to do>)` on stderr, never a traceback.

Rules:
1. `describe(exc)` turns an SDK or OS error into that line; unknown errors keep their message.
2. A frame length whose four bytes are ASCII letters means the peer answered in text: "HTTP"
   read as a length is 1,213,486,160 (the decoder reports 4 more, the frame's own length
   field), so the hint names the HTTP port mistake.
3. Hints never echo secrets: only addresses, topics and groups appear.
"""
from __future__ import annotations

import re
import socket

from tidemq import errors

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INCOMPLETE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_PIPE = 141   # 128 + SIGPIPE: the reader of stdout went away (`| head`)

_LENGTH = re.compile(r"(\d{9,10})")


class Detailed(ValueError):
    """An error whose first line is the message and whose later lines are evidence (a log
    tail) worth printing too: `tidemq cluster up` when a process exits at start."""


def text_length_hint(message: str) -> str | None:
    """Rule 2: a huge frame length that is four printable ASCII bytes."""
    for m in _LENGTH.finditer(message):
        for n in (int(m.group(1)) - 4, int(m.group(1))):
            if 0 <= n < 2 ** 32 and all(32 <= b < 127 for b in n.to_bytes(4, "big")):
                break
        else:
            continue
        text = n.to_bytes(4, "big").decode("ascii")
        if text.startswith("HTTP"):
            return ("this looks like an HTTP port (the answer began with \"HTTP\"): give -b "
                    "the remoting port (broker 10911, name server 9876), not the admin/HTTP port")
        return (f"the peer answered with text ({text!r}...), not the RocketMQ remoting "
                f"protocol: is -b the remoting port?")
    return None


def hint_for(exc: BaseException) -> str | None:
    msg = str(exc)
    if isinstance(exc, (errors.ProtocolViolation, errors.ConnectionError)):
        hint = text_length_hint(msg)
        if hint:
            return hint
    if isinstance(exc, errors.ConnectionError) or "cannot connect" in msg:
        if "gaierror" in msg or "Name or service not known" in msg:
            return ("the host name does not resolve; several name servers are separated by ';' "
                    "(quote the list in the shell: -b \"host1:9876;host2:9876\")")
        if "Connection refused" in msg or "ConnectionRefused" in msg:
            return "nothing listens there: is the broker or name server running, and is the port right?"
        if "TimeoutError" in msg or "timed out" in msg:
            return "no answer in time: a firewall, a wrong host, or TLS expected (--tls-ca)?"
        if "SSL" in msg or "ssl" in msg:
            return "TLS failed: check --tls-ca (or the server does not speak TLS)"
    if isinstance(exc, errors.TopicNotExist):
        return "create it with `tidemq topic create TOPIC`, or list topics with `tidemq topic list`"
    if isinstance(exc, errors.NoPermission):
        if "forbidden" in msg and "topic[" in msg:   # the topic's own permission, not the ACL
            return "the topic's permission forbids it: `tidemq topic update TOPIC --perm rw`"
        return ("the ACL refused it: pass credentials with --credentials-file or "
                "TIDEMQ_ACCESS_KEY/TIDEMQ_SECRET_KEY")
    if isinstance(exc, errors.RequestCodeNotSupported):
        return "this server does not answer that request: is -b a TideMQ broker or name server?"
    if isinstance(exc, errors.RequestTimeout):
        return "the server did not answer in time; try again, or check its load and logs"
    if isinstance(exc, errors.ServiceNotAvailable) and "master" in msg:
        return "wait for the election to finish (`tidemq cluster list`) and retry"
    return None


def describe(exc: BaseException) -> str:
    """Rule 1: the one line printed for `exc`."""
    text = str(exc).strip()
    msg = (text if isinstance(exc, Detailed) else text.splitlines()[0]) if text else \
        type(exc).__name__
    if isinstance(exc, socket.gaierror):
        msg = f"cannot resolve a host name: {exc}"
    hint = hint_for(exc)
    return f"{msg} (hint: {hint})" if hint else msg
