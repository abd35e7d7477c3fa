"""Routes of a statically replicated broker group (ha.role MASTER or SLAVE, no ZooKeeper).

Any member answers GET_ROUTEINFO_BY_TOPIC (105) for the whole group, from what its HA link
knows, so clients see one brokerName with its master and slaves and never take a slave's
route for a group without a master (client/topic_routes.py rule 5 would re-fetch it every 0.5 s):

- the master: {0: itself} plus each connected slave under its broker id;
- a slave: {0: its master, its own broker id: itself} (the master's remoting address comes
  in the HA handshake reply; until the first accepted handshake only itself is listed);
- a slave promoted by become_master lists itself as 0 (plus its connected slaves).

Numeric broker ids (the rule, `slave_broker_ids`): a slave is listed and suggested under the
broker_id it is configured with, carried in the HA handshake next to its advertised remoting
address. HA node ids (ha.node_id, numeric like "1" or not like "g1-1") are session names only
and never parsed. Ids <= 0 and a second slave claiming an id already taken (ordered by node
id) are left out of routes, so a route never names two addresses for one id. Cluster mode
does not use this module: name servers number slaves there (coordinator/view.py rule 1).
"""
from __future__ import annotations

from tidemq.node.replication.roles import MASTER_ID, one_group_route
from tidemq.protocol.route_json import BrokerData, TopicRouteData


def slave_broker_ids(endpoints: dict[str, tuple[int, str]]) -> dict[str, tuple[int, str]]:
    """node -> (broker id, addr) of the slaves that may appear in routes (module rule)."""
    out, taken = {}, set()
    for node in sorted(endpoints):
        broker_id, addr = endpoints[node]
        if broker_id > MASTER_ID and addr and broker_id not in taken:
            taken.add(broker_id)
            out[node] = (broker_id, addr)
    return out


class ReplicatedRouting:
    """node/replication/roles.py's Routing for a static group member; reads the HA state per query."""

    def __init__(self, topics, cluster_name: str, broker_name: str, addr: str, broker_id: int,
                 replication):
        self.topics = topics
        self.cluster_name = cluster_name
        self.broker_name = broker_name
        self.addr = addr
        self.broker_id = broker_id
        self.replication = replication

    def broker_addrs(self) -> dict[int, str]:
        svc = self.replication.service
        if self.replication.is_master:
            addrs = {MASTER_ID: self.addr}
            for broker_id, addr in slave_broker_ids(svc.slave_endpoints).values():
                addrs[broker_id] = addr
            return addrs
        addrs = {self.broker_id: self.addr}
        master = svc.master_remoting_addr if self.replication.master_addr else ""
        if master:
            addrs[MASTER_ID] = master
        return addrs

    def route(self, topic: str) -> TopicRouteData | None:
        tc = self.topics.route_topic(topic)
        if tc is None:
            return None
        return one_group_route(tc, BrokerData(self.cluster_name, self.broker_name,
                                              self.broker_addrs()))
