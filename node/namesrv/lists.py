"""The name server's cluster-wide listings, as RocketMQ's admin tools (mqadmin, Dashboard) ask
for them: pure functions from a ClusterView snapshot to response bodies.

    206 GET_ALL_TOPIC_LIST_FROM_NAMESERVER   {"topicList": [every topic of every group]}
    224 GET_TOPICS_BY_CLUSTER (ext cluster)  the same for that cluster; another cluster -> 1
    304 GET_SYSTEM_TOPIC_LIST_FROM_NS        {"topicList": [cluster, group names...],
                                              "brokerAddr": a master's address}
    311/312/313 unit topic lists             {"topicList": []} (TideMQ has no unit topics)
    101 GET_KV_CONFIG, 219 GET_KVLIST_BY_NAMESPACE   22 QUERY_NOT_FOUND (no KV store)
    216 DELETE_TOPIC_IN_NAMESRV (ext topic)  0: nothing to do here (rule 4)

Rules:
1. A topic is listed once its `topics/<topic>` node exists in some group, whether or not that
   group has a master now (a listing is not a route: it must not flicker during an election).
2. Bodies are compact standard JSON with sorted lists, so answers from several name servers
   of one cluster are byte-identical.
3. Nothing here changes state; the KV write codes (100, 102) stay unsupported.
4. mqadmin's deleteTopic deletes on the brokers (215), then asks every name server (216) and
   fails if one refuses. A TideMQ name server keeps no topic of its own: the route goes
   when the brokers' topic nodes leave ZooKeeper, so 216 succeeds without changing anything.
"""
from __future__ import annotations

import json

from tidemq.node.processors.common import error, ok
from tidemq.protocol.codes import RequestCode, ResponseCode


def all_topics(snapshot) -> list[str]:
    return sorted({t for g in snapshot.values() for t in g.topics})


def system_topics(snapshot, cluster: str) -> dict:
    """Java lists the cluster and broker names (each is also a topic on its broker)."""
    body = {"topicList": sorted({cluster} | set(snapshot))}
    for name in sorted(snapshot):
        master = snapshot[name].broker_addrs().get(0)
        if master:
            body["brokerAddr"] = master
            break
    return body


def _body(doc) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


class NameServerLists:
    """Handlers for the listing codes over a live ClusterView."""

    def __init__(self, view):
        self.view = view

    def register(self, server) -> None:
        for code, fn in ((RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self.all_topics),
                         (RequestCode.GET_TOPICS_BY_CLUSTER, self.topics_by_cluster),
                         (RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS, self.system_topics),
                         (RequestCode.GET_UNIT_TOPIC_LIST, self.empty_list),
                         (RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST, self.empty_list),
                         (RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST, self.empty_list),
                         (RequestCode.GET_KV_CONFIG, self.kv_not_found),
                         (RequestCode.GET_KVLIST_BY_NAMESPACE, self.kv_not_found),
                         (RequestCode.DELETE_TOPIC_IN_NAMESRV, self.delete_topic)):
            server.register(code, fn)

    def all_topics(self, conn, cmd):
        return ok(cmd, body=_body({"topicList": all_topics(self.view.snapshot)}))

    def topics_by_cluster(self, conn, cmd):
        cluster = cmd.require_str("cluster")
        if cluster != self.view.paths.cluster:
            return error(cmd, ResponseCode.SYSTEM_ERROR,
                         f"cluster {cluster!r} is not served here (this name server serves "
                         f"{self.view.paths.cluster!r})")
        return ok(cmd, body=_body({"topicList": all_topics(self.view.snapshot)}))

    def system_topics(self, conn, cmd):
        return ok(cmd, body=_body(system_topics(self.view.snapshot, self.view.paths.cluster)))

    def empty_list(self, conn, cmd):
        return ok(cmd, body=_body({"topicList": []}))

    def delete_topic(self, conn, cmd):
        cmd.require_str("topic")   # rule 4
        return ok(cmd)

    def kv_not_found(self, conn, cmd):
        ns = (cmd.ext or {}).get("namespace", "")
        return error(cmd, ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {ns}")
