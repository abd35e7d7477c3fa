"""Role and routing seams: who this broker is in its group, and who answers route queries.

Standalone mode (no ZooKeeper): the broker is the master (id 0) of its own group, always
writable, and answers GET_ROUTEINFO_BY_TOPIC (105) for itself. Cluster mode (node/replication/cluster_mode.py)
uses node/replication/service.py's role, driven by the ZooKeeper election (writable only while an
unfenced master), and the broker does not answer 105: `tidemq namesrv` does, from ZooKeeper
(coordinator/view.py).
"""
from __future__ import annotations

from typing import Protocol

from tidemq.protocol.route_json import BrokerData, QueueData, TopicRouteData

MASTER_ID = 0


class Role(Protocol):
    broker_id: int

    @property
    def writable(self) -> bool:
        """May accept sends (a master that is not fenced)."""

    @property
    def state_ready(self) -> bool:
        """Writable, and delayed delivery / transactions may run (replication rule 6)."""


class StandaloneRole:
    broker_id = MASTER_ID
    writable = True
    state_ready = True


class Routing(Protocol):
    def route(self, topic: str) -> TopicRouteData | None: ...


class StandaloneRouting:
    """Routes naming this broker alone: brokerAddrs {"0": advertised address}."""

    def __init__(self, topics, cluster_name: str, broker_name: str, addr: str,
                 broker_id: int = MASTER_ID):
        self.topics = topics
        # A replicated slave names itself by its own id: clients send only to id 0.
        self._broker = BrokerData(cluster_name, broker_name, {broker_id: addr})
        self.broker_name = broker_name

    def route(self, topic: str) -> TopicRouteData | None:
        tc = self.topics.route_topic(topic)
        return None if tc is None else one_group_route(tc, self._broker)


def one_group_route(tc, broker: BrokerData) -> TopicRouteData:
    """The route of a topic that one broker group serves: every queue on `broker`."""
    queue = QueueData(broker.broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm,
                      tc.sys_flag)
    return TopicRouteData([queue], [broker])
