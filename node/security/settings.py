"""The `[security]` config table and what the broker builds from it: the ACL validator, the
TLS contexts of the remoting and admin ports, the admin HTTP credential.

Everything is off by default (the standalone quickstart runs plaintext without ACL); one table
turns it on:

    [security]
    acl_enable = true
    acl_file = "/etc/tidemq/acl.toml"
    tls_enable = true
    tls_cert_file = "server.pem"; tls_key_file = "server.key"; tls_ca_file = "ca.pem"
    admin_tls_enable = true
    admin_token_file = "/etc/tidemq/admin.token"

Rules:
1. Secrets are never config values: the admin token comes from admin_token_file or the
   admin_token_env variable, ACL secrets from the ACL file (or files / variables it names).
2. `security_problems` checks files exist and settings fit together, with the others in
   load_config's single report; contexts are built once at start.
3. A cluster-mode broker with HA TLS must have a certificate: any member may be promoted.
4. ZooKeeper TLS and credentials (`zookeeper.*`) are checked here too; `zk_security` turns them
   into coordinator/zk_security.py's ZkSecurity.
5. The certificate this node serves is checked for expiry at start: a WARNING when it has
   expired or expires within CERT_WARN_DAYS (the ssl module loads an expired one silently and
   every handshake then fails), and its notAfter is the metric
   tidemq_tls_cert_not_after_timestamp_seconds.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from tidemq.coordinator.zk_security import ZkSecurity, ZkSecurityError, read_auth_file
from tidemq.node.config_fields import config_field, missing_file
from tidemq.tls import TlsConfigError, TlsFiles, cert_not_after

_f = config_field
log = logging.getLogger("tidemq.security")
CERT_WARN_DAYS = 30


@dataclass(frozen=True)
class SecuritySection:
    acl_enable: bool = _f(False, "Check RocketMQ ACL 1.0 signatures and permissions on the "
                                 "remoting port.")
    acl_file: str = _f("", "ACL accounts file (TOML; node/security/acl/accounts.py); reloaded when it "
                           "changes.")
    acl_reload_interval_ms: int = _f(1000, "How often the ACL file's mtime is checked.")
    tls_enable: bool = _f(False, "TLS on the remoting port (plaintext clients are refused).")
    tls_cert_file: str = _f("", "PEM certificate chain of this node (all TLS ports).")
    tls_key_file: str = _f("", "PEM private key of tls_cert_file.")
    tls_ca_file: str = _f("", "PEM CA bundle that verifies peers' client certificates.")
    tls_require_client_cert: bool = _f(False, "Remoting: refuse clients without a certificate "
                                              "signed by tls_ca_file (mutual TLS).")
    tls_handshake_timeout_ms: int = _f(10_000, "A TLS handshake not done in this time is cut.")
    admin_tls_enable: bool = _f(False, "TLS (HTTPS) on the admin HTTP port, same certificate.")
    admin_read_open: bool = _f(True, "Admin HTTP GET endpoints need no credential; false = "
                                     "every endpoint needs the admin token.")
    admin_token_file: str = _f("", "File holding the admin HTTP bearer token (needed by every "
                                   "endpoint that changes state).")
    admin_token_env: str = _f("TIDEMQ_ADMIN_TOKEN", "Variable holding the admin token when "
                                                    "admin_token_file is empty.")
    ha_tls_enable: bool = _f(False, "TLS on HA links: the master's HA port serves it, a slave "
                                    "verifies the master against tls_ca_file.")
    ha_require_client_cert: bool = _f(True, "With ha_tls_enable: the master refuses a slave "
                                            "without a certificate from tls_ca_file (mutual "
                                            "TLS); slaves present tls_cert_file.")

    def tls_files(self) -> TlsFiles:
        return TlsFiles(self.tls_cert_file, self.tls_key_file, self.tls_ca_file,
                        self.tls_require_client_cert)


def security_problems(cfg) -> list[str]:
    s = cfg.security
    p = []
    if s.acl_enable:
        if not s.acl_file:
            p.append("security.acl_file is required when security.acl_enable is true")
        p.extend(missing_file("security.acl_file", s.acl_file))
    if s.acl_reload_interval_ms <= 0 or s.tls_handshake_timeout_ms <= 0:
        p.append("security.acl_reload_interval_ms and tls_handshake_timeout_ms must be > 0")
    if s.ha_tls_enable and not s.tls_ca_file:
        p.append("security.ha_tls_enable needs security.tls_ca_file (peers verify each other)")
    if s.ha_tls_enable and cfg.ha.role == "cluster" and not (s.tls_cert_file and s.tls_key_file):
        # Rule 3: any cluster member may be elected and must then serve HA over TLS.
        p.append("security.ha_tls_enable in cluster mode needs security.tls_cert_file and "
                 "security.tls_key_file on every member: any member may be promoted to master "
                 "and must then serve TLS on its HA port")
    ha_serves = s.ha_tls_enable and cfg.ha.role != "SLAVE"  # a slave may go without a cert
    if s.tls_enable or s.admin_tls_enable or ha_serves:
        try:
            s.tls_files().server()
        except TlsConfigError as exc:
            p.append(f"security: {exc}")
    elif s.tls_require_client_cert:
        p.append("security.tls_require_client_cert needs security.tls_enable")
    p.extend(missing_file("security.admin_token_file", s.admin_token_file))
    p.extend(zookeeper_problems(cfg))
    return p


def zookeeper_problems(cfg) -> list[str]:
    z = cfg.zookeeper
    if z.auth and z.auth_file:
        return ["zookeeper.auth and zookeeper.auth_file: set one of them"]
    missing = missing_file("zookeeper.auth_file", z.auth_file)
    if missing:
        return missing
    if z.auth_file or z.auth or z.tls_enable:
        try:
            return [f"zookeeper: {e}" for e in zk_security(cfg).problems()]
        except ZkSecurityError as exc:
            return [f"zookeeper: {exc}"]
    return []


def zk_security(cfg) -> ZkSecurity:
    """How this broker reaches ZooKeeper (coordinator/zk_security.py): the zookeeper.tls_*
    files fall back to the security.tls_* ones; credentials from auth_file or auth."""
    z, s = cfg.zookeeper, cfg.security
    auth = read_auth_file(z.auth_file) if z.auth_file else z.auth
    return ZkSecurity(auth=auth, world_read=z.acl_world_read, tls=z.tls_enable,
                      ca_file=z.tls_ca_file or s.tls_ca_file,
                      cert_file=z.tls_cert_file or s.tls_cert_file,
                      key_file=z.tls_key_file or s.tls_key_file)


def remoting_ssl(cfg):
    return cfg.security.tls_files().server() if cfg.security.tls_enable else None


def admin_ssl(cfg):
    return cfg.security.tls_files().server() if cfg.security.admin_tls_enable else None


def ha_tls(cfg) -> tuple:
    """(server context, client context) for HA links, or (None, None). The slave presents this
    node's certificate; the master asks for it and, by default, requires it."""
    s = cfg.security
    if not s.ha_tls_enable:
        return None, None
    # A static SLAVE may run without a certificate (then it cannot pass mutual TLS); every
    # node that can serve HA (MASTER, cluster members) is checked to have one at config load.
    server = TlsFiles(s.tls_cert_file, s.tls_key_file, s.tls_ca_file,
                      s.ha_require_client_cert).server() if s.tls_cert_file else None
    return server, s.tls_files().client()


def served_cert_not_after(cfg) -> float | None:
    """notAfter (Unix time) of tls_cert_file when a port of this node serves it, else None
    (also when it cannot be read: load_config already checked it loads)."""
    s = cfg.security
    if not s.tls_cert_file or not (s.tls_enable or s.admin_tls_enable or s.ha_tls_enable):
        return None
    try:
        return cert_not_after(s.tls_cert_file)
    except TlsConfigError:
        return None


def log_cert_expiry(cfg, now: float | None = None) -> float | None:
    """Rule 5 at start: one line about the served certificate's expiry; returns notAfter."""
    not_after = served_cert_not_after(cfg)
    if not_after is None:
        if cfg.security.tls_cert_file and (cfg.security.tls_enable or cfg.security.admin_tls_enable
                                           or cfg.security.ha_tls_enable):
            log.warning("cannot read the expiry of TLS certificate %s",
                        cfg.security.tls_cert_file)
        return None
    left_s = not_after - (time.time() if now is None else now)
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(not_after))
    path = cfg.security.tls_cert_file
    if left_s <= 0:
        log.warning("TLS certificate %s EXPIRED on %s (%.0f days ago): clients that verify it "
                    "refuse every connection; replace it", path, until, -left_s / 86400)
    elif left_s < CERT_WARN_DAYS * 86400:
        log.warning("TLS certificate %s expires on %s, in %.1f days: replace it", path, until,
                    left_s / 86400)
    else:
        log.info("TLS certificate %s is valid until %s", path, until)
    return not_after


def make_acl(cfg):
    if not cfg.security.acl_enable:
        return None
    from tidemq.node.security.acl.validator import AclValidator
    return AclValidator(cfg.security.acl_file, cfg.security.acl_reload_interval_ms)


def admin_token(cfg, environ=None) -> str:
    """The admin HTTP token (rule 1); "" = none configured (changing endpoints refused)."""
    s = cfg.security
    if s.admin_token_file:
        with open(s.admin_token_file, encoding="utf-8") as f:
            return f.read().strip()
    env = os.environ if environ is None else environ
    return env.get(s.admin_token_env, "") if s.admin_token_env else ""
