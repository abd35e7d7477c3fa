"""ClientManager: who is connected, in which producer and consumer groups, subscribed to what.

RocketMQ's ProducerManager + ConsumerManager, keyed by connection.

Rules:
1. A heartbeat (34) (re)registers its connection in every group it names; a connection that
   stops naming a group leaves it. The group's subscriptions are the latest heartbeat's.
2. A consumer group's member set changes when a connection joins or leaves it (heartbeat,
   unregister 35, connection closed, expiry); every such change is returned to the caller,
   which sends NOTIFY_CONSUMER_IDS_CHANGED (40) to every remaining member.
3. Client ids are kept exactly as received (cpp finds itself in 38's list by string equality).
4. A registration not refreshed for client_expiry_ms expires; the caller closes the connection.
5. Bounded: at most MAX_GROUPS groups in all, MAX_GROUPS_PER_CLIENT per heartbeat.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MAX_GROUPS = 100_000
MAX_GROUPS_PER_CLIENT = 1_000


class TooManyGroups(Exception):
    pass


@dataclass
class ClientRecord:
    client_id: str
    language: int
    version: int
    last_update: float
    producer_groups: set[str] = field(default_factory=set)
    consumer_groups: set[str] = field(default_factory=set)


@dataclass
class ConsumerGroup:
    members: dict[object, ClientRecord] = field(default_factory=dict)  # conn -> its record
    subscriptions: dict = field(default_factory=dict)  # topic -> SubscriptionData
    consume_type: str | None = None
    message_model: str | None = None
    consume_from_where: str | None = None


class ClientManager:
    def __init__(self, expiry_s: float):
        self.expiry_s = expiry_s
        self.consumers: dict[str, ConsumerGroup] = {}
        self.producers: dict[str, dict[object, ClientRecord]] = {}  # group -> {conn: record}
        self.records: dict[object, ClientRecord] = {}  # conn -> ClientRecord

    def heartbeat(self, conn, hb, language: int, version: int, now: float) -> list[str]:
        """Register `conn` per the heartbeat; returns the consumer groups whose members changed."""
        groups = {c.group_name for c in hb.consumers}
        if len(groups) + len(hb.producer_groups) > MAX_GROUPS_PER_CLIENT:
            raise TooManyGroups(f"a heartbeat may name at most {MAX_GROUPS_PER_CLIENT} groups")
        new_groups = ((groups - self.consumers.keys())
                      | (set(hb.producer_groups) - self.producers.keys()))
        if len(self.consumers) + len(self.producers) + len(new_groups) > MAX_GROUPS:
            raise TooManyGroups(f"the broker tracks at most {MAX_GROUPS} groups")
        changed = []
        rec: ClientRecord | None = self.records.get(conn)
        if rec is not None and rec.client_id != hb.client_id:  # a new client on this connection
            changed.extend(self.connection_closed(conn))
            rec = None
        if rec is None:
            rec = ClientRecord(hb.client_id, language, version, now, set(), set())
            self.records[conn] = rec
        rec.last_update = now
        for data in hb.consumers:
            group = self.consumers.get(data.group_name)
            if group is None:
                group = self.consumers[data.group_name] = ConsumerGroup()
            if group.members.get(conn) is not rec:
                if conn not in group.members:
                    changed.append(data.group_name)
                group.members[conn] = rec
            group.subscriptions = {s.topic: s for s in data.subscriptions}
            group.consume_type = data.consume_type
            group.message_model = data.message_model
            group.consume_from_where = data.consume_from_where
        for name in hb.producer_groups:
            self.producers.setdefault(name, {})[conn] = rec
        for name in rec.consumer_groups - groups:
            if self._leave_consumer(conn, name):
                changed.append(name)
        for name in rec.producer_groups - set(hb.producer_groups):
            self._leave_producer(conn, name)
        rec.consumer_groups = groups
        rec.producer_groups = set(hb.producer_groups)
        return list(dict.fromkeys(changed))

    def unregister(self, conn, client_id: str, producer_group: str | None,
                   consumer_group: str | None) -> list[str]:
        rec = self.records.get(conn)
        if rec is None or rec.client_id != client_id:
            return []
        changed = []
        if producer_group:
            self._leave_producer(conn, producer_group)
            rec.producer_groups.discard(producer_group)
        if consumer_group and self._leave_consumer(conn, consumer_group):
            rec.consumer_groups.discard(consumer_group)
            changed.append(consumer_group)
        if not rec.producer_groups and not rec.consumer_groups:
            del self.records[conn]
        return changed

    def connection_closed(self, conn) -> list[str]:
        rec = self.records.pop(conn, None)
        if rec is None:
            return []
        for name in rec.producer_groups:
            self._leave_producer(conn, name)
        return [name for name in rec.consumer_groups if self._leave_consumer(conn, name)]

    def expired(self, now: float) -> list:
        """Connections whose registration is older than the expiry (rule 4)."""
        return [conn for conn, rec in self.records.items() if now - rec.last_update > self.expiry_s]

    def consumer_ids(self, group: str) -> list[str]:
        g = self.consumers.get(group)
        return list(dict.fromkeys(rec.client_id for rec in g.members.values())) if g else []

    def members(self, group: str) -> list:
        g = self.consumers.get(group)
        return list(g.members) if g else []

    def message_model(self, group: str) -> str | None:
        """CLUSTERING / BROADCASTING as the group's consumers registered it, None if none."""
        g = self.consumers.get(group)
        return g.message_model if g else None

    def subscription(self, group: str, topic: str):
        g = self.consumers.get(group)
        return g.subscriptions.get(topic) if g else None

    def _leave_consumer(self, conn, name: str) -> bool:
        group = self.consumers.get(name)
        if group is None or conn not in group.members:
            return False
        del group.members[conn]
        if not group.members:
            del self.consumers[name]
        return True

    def _leave_producer(self, conn, name: str) -> None:
        members = self.producers.get(name)
        if members is not None:
            members.pop(conn, None)
            if not members:
                del self.producers[name]
