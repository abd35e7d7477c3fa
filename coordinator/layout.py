"""The ZooKeeper znode layout of a TideMQ cluster and the JSON documents in it. PURE.

    /tidemq/<cluster>/groups/<group>/state            persistent  GroupState
    /tidemq/<cluster>/groups/<group>/leader           ephemeral   Leader (the master's session)
    /tidemq/<cluster>/groups/<group>/members/<node>   ephemeral   Member (one per live broker)
    /tidemq/<cluster>/groups/<group>/topics/<topic>   persistent  topic config (TopicConfig JSON)
    /tidemq/<cluster>/groups/<group>/handoff          persistent  {"to": node} (graceful hand-off)
    /tidemq/<cluster>/groups/<group>/down/<node>      ephemeral   {"epoch": E, "master": m}

GroupState = {"epoch": E, "master": node | null, "in_sync": [node, ...]}
Leader     = {"node": n, "epoch": E, "addr": "ip:port", "ha_addr": "ip:port" | "", "ready": bool}
Member     = {"node": n, "broker_id": i, "addr": "ip:port", "role": "MASTER|SLAVE|NONE|FENCED",
              "epoch": E, "last_epoch": E, "max_offset": b, "acked_offset": b,
              "confirmed_offset": b, "election_round": E, "updated_ms": t,
              "grpc_addr": "ip:port" | ""}   (its RocketMQ 5 gRPC endpoint, when served)

Rules:
1. `state` changes only by compare-and-set on its znode version. The epoch and the in-sync set
   share that one znode, so an in-sync change made for epoch E fails once epoch E+1 exists.
2. An election is one transaction: check `state`'s version, set `state` to epoch E+1 with the
   winner as master, create the ephemeral `leader`. A live `leader` makes it fail (NodeExists).
3. `leader` is ephemeral: it vanishes when the master's session expires (crash, pause longer
   than the session timeout, partition), which is what starts the next election.
4. Every in_sync member holds every byte the group acknowledged (ha/in_sync.py rules 2-3), so
   any live one is a safe master; the election prefers the newest epoch, then the longest log.
5. Topic configs under a group are the source of truth for that group's topics in cluster
   mode; a topic on several groups spreads its queues over all of them.
6. `handoff` asks the master to pass its role to an in-sync member: the master stops writes,
   waits (bounded) until that member holds its whole log, and deletes `leader`; the election
   then prefers the named member, which deletes `handoff` once it leads.
7. With credentials configured every znode above carries a digest ACL for that identity
   (coordinator/zk_security.py): no other identity can change any of it.
8. `down/<node>` is a member's vote that the master of epoch E is gone (its process no longer
   listens): when every live in-sync member but the master has voted, the election winner
   deletes the master's `leader` and takes epoch E+1 in one transaction that checks `state`,
   the votes and `leader` (coordinator/fast_failover.py, with its safety argument).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

ROOT = "/tidemq"
# Node ids, group and cluster names become path segments: keep them to safe characters.
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
NAME_MAX_CHARS = 128


class LayoutError(ValueError):
    """A name that cannot be a path segment, or a znode document that does not parse."""


def check_name(kind: str, name: str) -> str:
    if not name or len(name) > NAME_MAX_CHARS or not set(name) <= NAME_CHARS or name in (".", ".."):
        raise LayoutError(f"{kind} {name!r}: 1-{NAME_MAX_CHARS} of letters, digits, '-', '_', '.'")
    return name


class ClusterPaths:
    def __init__(self, cluster: str, root: str = ROOT):
        self.root = root.rstrip("/")
        self.cluster = check_name("cluster", cluster)
        self.base = f"{self.root}/{cluster}"
        self.groups = f"{self.base}/groups"

    def group(self, group: str) -> GroupPaths:
        return GroupPaths(self, check_name("group", group))


class GroupPaths:
    def __init__(self, cluster: ClusterPaths, group: str):
        self.name = group
        self.base = f"{cluster.groups}/{group}"
        self.state = f"{self.base}/state"
        self.leader = f"{self.base}/leader"
        self.members = f"{self.base}/members"
        self.topics = f"{self.base}/topics"
        self.handoff = f"{self.base}/handoff"
        self.down = f"{self.base}/down"

    def member(self, node: str) -> str:
        return f"{self.members}/{check_name('node', node)}"

    def vote(self, node: str) -> str:
        return f"{self.down}/{check_name('node', node)}"

    def topic(self, topic: str) -> str:
        return f"{self.topics}/{topic}"


def _load(data: bytes | None, what: str) -> dict:
    try:
        doc = json.loads(data or b"")
    except ValueError as exc:
        raise LayoutError(f"{what}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise LayoutError(f"{what}: not a JSON object")
    return doc


def _dump(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True)
class GroupState:
    epoch: int = 0
    master: str | None = None
    in_sync: frozenset[str] = frozenset()

    def encode(self) -> bytes:
        return _dump({"epoch": self.epoch, "master": self.master,
                      "in_sync": sorted(self.in_sync)})

    @classmethod
    def decode(cls, data: bytes | None) -> GroupState:
        doc = _load(data, "group state")
        try:
            return cls(int(doc["epoch"]), doc.get("master"), frozenset(doc.get("in_sync", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"group state: {exc!r}") from None

    def replace(self, **kw) -> GroupState:
        d = {"epoch": self.epoch, "master": self.master, "in_sync": self.in_sync}
        d.update(kw)
        return GroupState(d["epoch"], d["master"], frozenset(d["in_sync"]))


@dataclass(frozen=True)
class Leader:
    node: str
    epoch: int
    addr: str = ""
    ha_addr: str = ""
    ready: bool = False

    def encode(self) -> bytes:
        return _dump(asdict(self))

    @classmethod
    def decode(cls, data: bytes | None) -> Leader:
        doc = _load(data, "leader")
        try:
            return cls(str(doc["node"]), int(doc["epoch"]), str(doc.get("addr", "")),
                       str(doc.get("ha_addr", "")), bool(doc.get("ready", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"leader: {exc!r}") from None


@dataclass(frozen=True)
class Member:
    node: str
    broker_id: int = 0
    addr: str = ""
    role: str = "NONE"
    epoch: int = 0
    last_epoch: int = 0
    max_offset: int = 0
    acked_offset: int = 0
    confirmed_offset: int = 0
    election_round: int = -1
    updated_ms: int = 0
    grpc_addr: str = ""
    extra: dict = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dump(asdict(self))

    @classmethod
    def decode(cls, data: bytes | None) -> Member:
        doc = _load(data, "member")
        try:
            return cls(str(doc["node"]), int(doc.get("broker_id", 0)), str(doc.get("addr", "")),
                       str(doc.get("role", "NONE")), int(doc.get("epoch", 0)),
                       int(doc.get("last_epoch", 0)), int(doc.get("max_offset", 0)),
                       int(doc.get("acked_offset", 0)), int(doc.get("confirmed_offset", 0)),
                       int(doc.get("election_round", -1)), int(doc.get("updated_ms", 0)),
                       grpc_addr=str(doc.get("grpc_addr", "")),
                       extra=dict(doc.get("extra", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"member: {exc!r}") from None


def encode_topic(doc: dict) -> bytes:
    return _dump(doc)


def decode_topic(data: bytes | None) -> dict:
    return _load(data, "topic config")
