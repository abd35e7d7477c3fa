"""AclValidator: decides whether one remoting request may run (RocketMQ's PlainAccessValidator).

Order of checks (RocketMQ 4.9.8's, with the TideMQ differences marked):
1. a peer in the global white list passes;
2. an empty or missing AccessKey is anonymous: refused unless the file has an [anonymous]
   table (TideMQ; cpp clients without credentials send AccessKey "" and sign with an empty
   key, so an anonymous request's signature is not checked);
3. an unknown AccessKey is refused;
4. the account's allowed_addresses must match the peer (TideMQ: a restriction, not a bypass);
5. the HMAC-SHA1 signature over the sorted ext values (minus Signature) + body must match;
   for 12 QUERY_MESSAGE also without `_UNIQUE_KEY_QUERY` (Java clients sign it, Java
   brokers leave it out);
6. ADMIN_CODES need an admin account;
7. every resource of `resources.needs(code, request)` (the typed request the processor reads),
   and for 33/36/37 the topic of the record they name
   (`record_access.py`, read before any processor runs), needs its permission (Java's checkPermission:
   DENY wins, ANY = PUB or SUB, else the bits must overlap); an admin account with no
   explicit permissions may do everything (Java's rule).

A refusal is a remark starting "[ACL]"; the server answers NO_PERMISSION (16) with it and hands
nothing to a processor, so nothing changes. Remarks name the access key (not a secret), the
resource and the permission, never a secret or a signature.

Reload: at most every reload_interval_ms (checked on the request path, a stat() call) the
file's (mtime, size, inode) is compared; when it changed the file is parsed whole and swapped in
at once. A file that no longer parses keeps the old table and logs the problems (no secrets).
"""
from __future__ import annotations

import collections
import hmac
import logging
import os
import stat
import time

from tidemq.acl_signing import SIGNATURE, signature, signature_content
from tidemq.node.requests import PARSERS, RequestError
from tidemq.node.security.acl.accounts import (
    ANY,
    DENY,
    PUB,
    SUB,
    AclFileError,
    load_acl_file,
    perm_name,
)
from tidemq.node.security.acl.record_access import ADMIN_ONLY, record_needs
from tidemq.node.security.acl.resources import (
    ADMIN_CODES,
    GROUP,
    AclRequestError,
    is_internal_topic,
    needs,
    topic_resource,
)
from tidemq.protocol.codes import RequestCode

log = logging.getLogger("tidemq.acl")
_QUERY_SKIP = (SIGNATURE, "_UNIQUE_KEY_QUERY")
_SHOWN_KEY_CHARS = 64


def has_perm(needed: int, owned: int) -> bool:
    """Java's Permission.checkPermission."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def _file_id(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class AclValidator:
    def __init__(self, path: str, reload_interval_ms: int = 1000, clock=time.monotonic,
                 environ=None):
        self.path = path
        self._environ = environ
        self._interval_s = reload_interval_ms / 1000
        self._clock = clock
        self._file_id = _file_id(path)
        self.table = load_acl_file(path, environ)  # AclFileError at start: the broker won't run
        self._next_check = clock() + self._interval_s
        self.refused: collections.Counter[str] = collections.Counter()  # reason -> refusals (fixed set of reasons)
        self.reloads = 0
        # offset -> record bytes (the store's get_record), set by the broker: 33/36/37 name a
        # record whose topic is known only once it is read (record_access.py)
        self.record_reader = None
        _warn_if_readable_by_others(path)

    # -- reload ----------------------------------------------------------------------------
    def maybe_reload(self) -> None:
        now = self._clock()
        if now < self._next_check:
            return
        self._next_check = now + self._interval_s
        file_id = _file_id(self.path)
        if file_id == self._file_id or file_id is None:
            return
        self._file_id = file_id
        try:
            self.table = load_acl_file(self.path, self._environ)
        except AclFileError as exc:
            log.error("ACL file changed but is not valid; keeping the previous accounts: %s", exc)
            return
        self.reloads += 1
        log.info("ACL file %s reloaded: %d accounts", self.path, len(self.table.accounts))

    # -- check -----------------------------------------------------------------------------
    def check(self, peer_ip: str, cmd, req=None) -> str | None:
        """None when the request may run, else the refusal remark. `req` is the typed request
        (node/requests/); the server passes it, other callers may let it be parsed here."""
        self.maybe_reload()
        table = self.table
        if table.global_white and table.global_white.matches(peer_ip):
            return None
        ext = cmd.ext or {}
        key = ext.get("AccessKey") or ""
        if not key:
            account = table.anonymous
            if account is None:
                return self._refuse("anonymous", "[ACL] anonymous requests are not allowed: "
                                                 "sign requests with an AccessKey")
        else:
            account = table.accounts.get(key)
            shown = repr(key[:_SHOWN_KEY_CHARS])
            if account is None:
                return self._refuse("unknown_key", f"[ACL] unknown AccessKey {shown}")
        who = f"AccessKey {shown}" if key else "anonymous"
        if not account.allowed.matches(peer_ip):
            return self._refuse("address", f"[ACL] {who} may not be used from {peer_ip}")
        if key and not self._signature_ok(account.secret_key, cmd, ext):
            return self._refuse("signature", f"[ACL] signature mismatch for {who}")
        code = cmd.code
        if code in ADMIN_CODES and not account.admin:
            return self._refuse("admin", f"[ACL] request code {code} needs an admin account; "
                                         f"{who} is not one")
        if account.admin and not account.topic_perms and not account.group_perms:
            return None
        try:
            if req is None and code in PARSERS:
                req = PARSERS[code](cmd)
            wanted = needs(code, req)
            on_record = record_needs(code, req, self.record_reader) if self.record_reader else None
        except RequestError as exc:
            return self._refuse("bad_request", f"[ACL] {exc.remark}")
        except AclRequestError as exc:
            return self._refuse("bad_request", f"[ACL] {exc}")
        if on_record is not None:
            topic, perm = on_record
            if topic is ADMIN_ONLY:
                if not account.admin:
                    return self._refuse("permission", f"[ACL] {who} may not touch internal "
                                                      f"records (admin accounts only)")
            else:
                wanted = wanted + [topic_resource(topic, perm)]
        for kind, name, perm in wanted:
            if kind != GROUP and is_internal_topic(name) and not account.admin:
                return self._refuse("permission", f"[ACL] {who} may not use internal topic "
                                                  f"{name!r} (admin accounts only)")
            owned = account.group_perm(name) if kind == GROUP else account.topic_perm(name)
            if not has_perm(perm, owned):
                return self._refuse("permission", f"[ACL] {who} has no {perm_name(perm)} "
                                                  f"permission on {kind} {name!r}")
        return None

    def topic_reader(self, peer_ip: str, cmd):
        """For a request check() let through: fn(topic) -> may its caller SUB on that topic,
        or None when the caller may read every topic. Replies that list many topics (208
        without a topic) show only those."""
        table = self.table
        if table.global_white and table.global_white.matches(peer_ip):
            return None
        key = (cmd.ext or {}).get("AccessKey") or ""
        account = table.accounts.get(key) if key else table.anonymous
        if account is None:
            return lambda topic: False
        if account.admin and not account.topic_perms and not account.group_perms:
            return None

        def may_read(topic: str) -> bool:
            kind, name, perm = topic_resource(topic, SUB)
            if kind != GROUP and is_internal_topic(name) and not account.admin:
                return False
            owned = account.group_perm(name) if kind == GROUP else account.topic_perm(name)
            return has_perm(perm, owned)
        return may_read

    def _signature_ok(self, secret: str, cmd, ext: dict) -> bool:
        given = ext.get(SIGNATURE)
        if not given:
            return False
        body = cmd.body or b""
        # bytes: compare_digest refuses str with non-ASCII characters (a peer's choice)
        given = given.encode("utf-8", "replace")
        expected = signature(secret, signature_content(ext, body)).encode("ascii")
        if hmac.compare_digest(expected, given):
            return True
        if cmd.code == RequestCode.QUERY_MESSAGE and "_UNIQUE_KEY_QUERY" in ext:
            expected = signature(secret, signature_content(ext, body, _QUERY_SKIP)).encode("ascii")
            return hmac.compare_digest(expected, given)
        return False

    def _refuse(self, reason: str, remark: str) -> str:
        self.refused[reason] += 1
        return remark


def _warn_if_readable_by_others(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning("ACL file %s is readable by other users (mode %o); it holds secrets: "
                    "chmod 600 it", path, stat.S_IMODE(mode))
