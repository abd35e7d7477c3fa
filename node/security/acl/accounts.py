"""The ACL accounts file: TOML, read whole, validated whole (every problem reported at once).

    global_white_addresses = ""          # RocketMQ's globalWhiteRemoteAddresses: no check at all
    [[accounts]]
    access_key = "app1"
    secret_key = "..."                   # or secret_env = "VAR" / secret_file = "/path"
    admin = false                        # may use the admin codes (17, 25, 200, 207, 215, 222)
    allowed_addresses = "*"              # where this key may be used from (default everywhere)
    default_topic_perm = "DENY"          # topics not listed below
    default_group_perm = "SUB"           # groups not listed below
    topic_perms = { Orders = "PUB|SUB", Audit = "DENY" }   # or ["Orders=PUB|SUB", ...]
    group_perms = { billing = "SUB" }
    [anonymous]                          # present = an empty AccessKey is allowed, with these
    default_topic_perm = "SUB"           # permissions (no admin); absent = refused
    ...

Keys are RocketMQ's plain_acl.yml keys in snake case, with one difference on purpose: an
account's address list (RocketMQ `whiteRemoteAddress`) lets RocketMQ requests from those
addresses skip the signature; here `allowed_addresses` only RESTRICTS where a key may be used.

Permission bits are RocketMQ's (Permission.java): DENY 1, ANY 2, PUB 4, SUB 8; the names DENY,
ANY, PUB, SUB, PUB|SUB (SUB|PUB) are accepted.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field

from tidemq.node.security.acl.addresses import AddressPatternError, AddressSet

DENY, ANY, PUB, SUB = 1, 2, 4, 8
_PERMS = {"DENY": DENY, "ANY": ANY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB,
          "SUB|PUB": PUB | SUB}
_ACCOUNT_KEYS = {"access_key", "secret_key", "secret_env", "secret_file", "admin",
                 "allowed_addresses", "default_topic_perm", "default_group_perm", "topic_perms",
                 "group_perms"}
_ANON_KEYS = {"allowed_addresses", "default_topic_perm", "default_group_perm", "topic_perms",
              "group_perms"}


class AclFileError(ValueError):
    def __init__(self, path: str, problems: list[str]):
        super().__init__(f"ACL file {path!r}:\n  - " + "\n  - ".join(problems))
        self.problems = problems


def perm_name(perm: int) -> str:
    if perm & DENY:
        return "DENY"
    names = [n for n, bit in (("PUB", PUB), ("SUB", SUB), ("ANY", ANY)) if perm & bit]
    return "|".join(names) or "NONE"


@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str = field(repr=False)
    admin: bool = False
    allowed: AddressSet = field(default_factory=lambda: AddressSet("*"), repr=False)
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    topic_perms: dict = field(default_factory=dict)
    group_perms: dict = field(default_factory=dict)

    def topic_perm(self, topic: str) -> int:
        return self.topic_perms.get(topic, self.default_topic_perm)

    def group_perm(self, group: str) -> int:
        return self.group_perms.get(group, self.default_group_perm)


@dataclass(frozen=True)
class AclTable:
    accounts: dict  # access key -> Account
    global_white: AddressSet
    anonymous: Account | None = None


def load_acl_file(path: str, environ=None) -> AclTable:
    env = os.environ if environ is None else environ
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise AclFileError(path, [f"cannot read: {exc.strerror}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise AclFileError(path, [f"not valid TOML: {exc}"]) from None
    return parse_acl(doc, path, env)


def parse_acl(doc: dict, path: str = "<acl>", environ=None) -> AclTable:
    env = os.environ if environ is None else environ
    problems: list[str] = []
    unknown = set(doc) - {"global_white_addresses", "accounts", "anonymous"}
    problems += [f"unknown key {k!r}" for k in sorted(unknown)]
    white = _addresses(doc.get("global_white_addresses", ""), "global_white_addresses", problems,
                       default="")
    accounts: dict[str, Account] = {}
    raw_accounts = doc.get("accounts", [])
    if not isinstance(raw_accounts, list):
        problems.append("'accounts' must be an array of tables ([[accounts]])")
        raw_accounts = []
    for i, raw in enumerate(raw_accounts):
        where = f"accounts[{i}]"
        if not isinstance(raw, dict):
            problems.append(f"{where} must be a table")
            continue
        acc = _account(raw, where, problems, env)
        if acc is None:
            continue
        if acc.access_key in accounts:
            problems.append(f"{where}: access_key {acc.access_key!r} appears twice")
        accounts[acc.access_key] = acc
    anonymous = None
    if "anonymous" in doc:
        raw = doc["anonymous"]
        if not isinstance(raw, dict):
            problems.append("'anonymous' must be a table")
        else:
            problems += [f"anonymous: unknown key {k!r}" for k in sorted(set(raw) - _ANON_KEYS)]
            anonymous = Account("", "", False, **_perms_of(raw, "anonymous", problems))
    if problems:
        raise AclFileError(path, problems)
    return AclTable(accounts, white, anonymous)


def _account(raw: dict, where: str, problems: list[str], env) -> Account | None:
    problems += [f"{where}: unknown key {k!r}" for k in sorted(set(raw) - _ACCOUNT_KEYS)]
    key = raw.get("access_key")
    if not isinstance(key, str) or not key:
        problems.append(f"{where}: access_key must be a non-empty string")
        return None
    where = f"account {key!r}"
    secret = _secret(raw, where, problems, env)
    admin = raw.get("admin", False)
    if not isinstance(admin, bool):
        problems.append(f"{where}: admin must be true or false")
        admin = False
    if secret is None:
        return None
    return Account(key, secret, admin, **_perms_of(raw, where, problems))


def _secret(raw: dict, where: str, problems: list[str], env) -> str | None:
    """The secret from exactly one of secret_key / secret_env / secret_file. Problems name the
    source, never the value."""
    given = [k for k in ("secret_key", "secret_env", "secret_file") if k in raw]
    if len(given) != 1:
        problems.append(f"{where}: give exactly one of secret_key, secret_env, secret_file")
        return None
    kind = given[0]
    value = raw[kind]
    if not isinstance(value, str) or not value:
        problems.append(f"{where}: {kind} must be a non-empty string")
        return None
    if kind == "secret_env":
        secret = env.get(value, "")
        if not secret:
            problems.append(f"{where}: environment variable {value!r} is not set")
            return None
        return secret
    if kind == "secret_file":
        try:
            with open(value, encoding="utf-8") as f:
                secret = f.read().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{where}: cannot read secret_file {value!r}: "
                            f"{getattr(exc, 'strerror', None) or type(exc).__name__}")
            return None
        if not secret:
            problems.append(f"{where}: secret_file {value!r} is empty")
            return None
        return secret
    return value


def _perms_of(raw: dict, where: str, problems: list[str]) -> dict:
    return {
        "allowed": _addresses(raw.get("allowed_addresses", "*"), f"{where}: allowed_addresses",
                              problems, default="*"),
        "default_topic_perm": _perm(raw.get("default_topic_perm", "DENY"),
                                    f"{where}: default_topic_perm", problems),
        "default_group_perm": _perm(raw.get("default_group_perm", "DENY"),
                                    f"{where}: default_group_perm", problems),
        "topic_perms": _perm_map(raw.get("topic_perms", {}), f"{where}: topic_perms", problems),
        "group_perms": _perm_map(raw.get("group_perms", {}), f"{where}: group_perms", problems),
    }


def _perm(value, where: str, problems: list[str]) -> int:
    perm = _PERMS.get(value.strip().upper()) if isinstance(value, str) else None
    if perm is None:
        problems.append(f"{where}: {value!r} is not one of DENY, ANY, PUB, SUB, PUB|SUB")
        return DENY
    return perm


def _perm_map(value, where: str, problems: list[str]) -> dict:
    """{name = "PERM"} or RocketMQ's list form ["name=PERM", ...]."""
    pairs = []
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, list):
        for item in value:
            name, sep, perm = item.rpartition("=") if isinstance(item, str) else ("", "", "")
            if not sep or not name:
                problems.append(f"{where}: {item!r} is not 'name=PERM'")
                continue
            pairs.append((name.strip(), perm))
    else:
        problems.append(f"{where}: must be a table or a list of 'name=PERM'")
    return {name: _perm(perm, f"{where}.{name}", problems) for name, perm in pairs}


def _addresses(value, where: str, problems: list[str], default: str) -> AddressSet:
    if not isinstance(value, (str, list)) or isinstance(value, list) and not all(
            isinstance(v, str) for v in value):
        problems.append(f"{where}: must be a string or a list of strings")
        return AddressSet(default)
    try:
        return AddressSet(value)
    except AddressPatternError as exc:
        problems.append(f"{where}: {exc}")
        return AddressSet(default)
