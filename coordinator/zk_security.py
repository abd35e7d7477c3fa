"""ZkSecurity: how a TideMQ process talks to ZooKeeper safely: TLS and digest ACLs.

Used by brokers (node/replication/cluster_mode.py builds it from `zookeeper.*`), name servers and `tidemq
handoff` (command-line flags, `add_cli_options` / `from_cli`).

Rules:
1. TLS (`tls`): kazoo connects with use_ssl to ZooKeeper's secureClientPort, verifies the
   server against `ca_file` and its host name, and presents `cert_file`/`key_file` (ZooKeeper's
   `ssl.clientAuth=need` refuses clients without one).
2. Digest ACLs (`auth` = "user:password"): the session authenticates on every (re)connect, and
   every znode TideMQ creates (persistent and ephemeral, parents included) gets
   digest:user:<hash> with all permissions, so no other identity can change the group state,
   epoch, in-sync set, leader, members or topics.
3. `world_read` adds world:anyone READ: everything there (addresses, roles, offsets, topic
   configs) is served to any client by the name servers anyway, and it lets name servers run
   without the write credential. False closes reads too: name servers then need the credential.
4. The password never appears in repr, logs or errors.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

AUTH_ENV = "TIDEMQ_ZK_AUTH"


class ZkSecurityError(ValueError):
    pass


def parse_auth(text: str) -> tuple[str, str]:
    user, sep, password = text.strip().partition(":")
    if not sep or not user or not password:
        raise ZkSecurityError("ZooKeeper credentials must look like 'user:password'")
    return user, password


def read_auth_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError as exc:
        raise ZkSecurityError(f"cannot read ZooKeeper credentials file {path!r}: "
                              f"{exc.__class__.__name__}") from None
    parse_auth(text)
    return text


@dataclass(frozen=True)
class ZkSecurity:
    auth: str = field(default="", repr=False)
    world_read: bool = True
    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def problems(self) -> list[str]:
        p = []
        if self.auth:
            try:
                parse_auth(self.auth)
            except ZkSecurityError as exc:
                p.append(str(exc))
        if self.tls:
            if not self.ca_file:
                p.append("ZooKeeper TLS needs a CA file to verify the servers")
            if bool(self.cert_file) != bool(self.key_file):
                p.append("ZooKeeper TLS client certificate and key go together")
            for kind, path in (("CA", self.ca_file), ("certificate", self.cert_file),
                               ("key", self.key_file)):
                if path and not os.path.isfile(path):
                    p.append(f"ZooKeeper TLS {kind} file {path!r} does not exist")
        return p

    def acl(self) -> list | None:
        """The ACL of every znode TideMQ creates (rules 2-3); None = kazoo's open ACL."""
        if not self.auth:
            return None
        from kazoo.security import make_acl, make_digest_acl
        user, password = parse_auth(self.auth)
        acl = [make_digest_acl(user, password, all=True)]
        if self.world_read:
            acl.append(make_acl("world", "anyone", read=True))
        return acl

    def kazoo_kwargs(self) -> dict:
        kw: dict = {}
        if self.auth:
            kw["auth_data"] = [("digest", self.auth)]
            kw["default_acl"] = self.acl()
        if self.tls:
            kw.update(use_ssl=True, ca=self.ca_file, verify_certs=True, check_hostname=True)
            if self.cert_file:
                kw.update(certfile=self.cert_file, keyfile=self.key_file)
        return kw


def add_cli_options(parser) -> None:
    g = parser.add_argument_group("ZooKeeper security")
    g.add_argument("--zk-tls", action="store_true", help="TLS to ZooKeeper (secureClientPort)")
    g.add_argument("--zk-tls-ca", default="", help="CA that verifies the ZooKeeper servers")
    g.add_argument("--zk-tls-cert", default="", help="client certificate for ZooKeeper")
    g.add_argument("--zk-tls-key", default="", help="key of --zk-tls-cert")
    g.add_argument("--zk-auth-file", default="",
                   help=f"file holding ZooKeeper digest credentials user:password "
                        f"(else ${AUTH_ENV}); never on the command line")


def from_cli(args, environ=None) -> ZkSecurity:
    env = os.environ if environ is None else environ
    auth = read_auth_file(args.zk_auth_file) if args.zk_auth_file else env.get(AUTH_ENV, "")
    sec = ZkSecurity(auth=auth, tls=bool(args.zk_tls or args.zk_tls_ca), ca_file=args.zk_tls_ca,
                     cert_file=args.zk_tls_cert, key_file=args.zk_tls_key)
    problems = sec.problems()
    if problems:
        raise ZkSecurityError("; ".join(problems))
    return sec
