"""Cluster mode over ZooKeeper: kazoo lives only in this package (zk.py bridges it to asyncio).

layout.py (znode layout, PURE) · election.py (who leads, PURE) · in_sync.py (the in-sync set
kept in ZooKeeper) · member.py (one broker's seat: register, elect, fence, follow) · replica.py
(what the coordinator drives) · topics.py (topic configs) · view.py (routes for name servers)
· handoff.py (`tidemq handoff`) · zk_security.py (TLS to ZooKeeper, digest ACLs; no kazoo at
import). The broker composes them in node/replication/cluster_mode.py.
"""
