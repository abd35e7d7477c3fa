"""gRPC routing and client sessions: QueryRoute, QueryAssignment, Heartbeat, Telemetry,
NotifyClientTermination.

Rules:
1. A route lists every queue of the topic on this broker (id 0, the master), with this
   broker's gRPC endpoint; an unknown topic is created when auto_create_topic is on and this
   broker is writable (as a remoting send to TBW102 would), else TOPIC_NOT_FOUND.
2. Telemetry: each Settings the client sends is answered with the broker's Settings: the
   client's own, plus publishing.max_body_size = store.max_message_bytes for producers and,
   for consumers, the long-polling timeout (capped by grpc_max_long_polling_ms), FIFO mode
   (grpc_fifo_groups) and a retry policy whose max_attempts is grpc_max_delivery_attempts
   and whose delays are the broker's delay_levels (push consumers wait them after a failure).
3. A producer's Telemetry stream is registered as the producer of each existing topic it
   publishes (at most MAX_TOPICS_PER_PRODUCER), so
   the transaction check-back (node/sending/transaction_service.py) can ask it about orphaned transactions
   (producer.TelemetryLink); the registration ends with the stream.
4. QueryAssignment hands a push consumer every readable queue of the topic (this broker owns
   them all; the receipt state keeps concurrent consumers of a group apart).
5. Cluster mode (`view` set: the cluster's ZooKeeper view, node/replication/cluster_mode.py):
   routes and assignments name, for every group holding the topic, its queues on that group's
   current master's gRPC endpoint, whichever node is asked (a slave too), so clients that
   re-query the route after a failover reach the new master. A group without a master is left
   out; when no group holding the topic has one the answer is HA_NOT_AVAILABLE (clients keep
   their last route and ask again). A topic no group holds yet is created by this node when it
   is the master and auto_create_topic is on (rule 1), else TOPIC_NOT_FOUND.
"""
from __future__ import annotations

import asyncio
import logging

from tidemq.node.grpc import proto as pb
from tidemq.node.grpc.common import client_id_of, status
from tidemq.node.grpc.producer import TelemetryLink, producer_group_of
from tidemq.node.sending.delay_plan import parse_levels
from tidemq.node.topics import AUTO_CREATE_TOPIC, TopicConfig

log = logging.getLogger("tidemq.grpc")
_READ, _WRITE = 4, 2
_SUB = 8  # ACL permission bits (node/security/acl/accounts.py)
MAX_TOPICS_PER_PRODUCER = 1024
_PERM = {_READ | _WRITE: pb.enum_value("Permission", "READ_WRITE"),
         _READ: pb.enum_value("Permission", "READ"), _WRITE: pb.enum_value("Permission", "WRITE"),
         0: pb.enum_value("Permission", "NONE")}
_ACCEPT = [pb.enum_value("MessageType", n) for n in ("NORMAL", "FIFO", "DELAY", "TRANSACTION")]
_PRODUCER = pb.enum_value("ClientType", "PRODUCER")
_IPV4, _IPV6 = pb.enum_value("AddressScheme", "IPv4"), pb.enum_value("AddressScheme", "IPv6")


class RoutingService:
    def __init__(self, server):
        self.server = server
        self.deps = server.deps
        self.links: set[TelemetryLink] = set()
        self.view = None   # cluster mode: coordinator/view.py ClusterView (rule 5)

    def endpoints(self, addr: str | None = None):
        """`addr` ("host:port") as Endpoints; this broker's gRPC endpoint by default."""
        if addr is None:
            addr = f"{self.deps.addr.rsplit(':', 1)[0]}:{self.server.port}"
        host, port = addr.rsplit(":", 1)
        host = host.strip("[]")
        ep = pb.Endpoints(scheme=_IPV6 if ":" in host else _IPV4)
        ep.addresses.add(host=host, port=int(port))
        return ep

    def topic_config(self, topic: str):
        """The topic's config, created like a remoting send would (rule 1); None if absent."""
        topics = self.deps.topics
        tc = topics.table.get(topic)
        if tc is None and self.deps.cfg.auto_create_topic and self.deps.role.writable:
            tc = topics.create_in_send(topic, AUTO_CREATE_TOPIC,
                                       self.deps.cfg.default_topic_queues)
        return tc

    def queue(self, tc, queue_id: int, perm: int, group: str | None = None, endpoints=None):
        """One queue of `tc` on `group`'s master (this broker by default)."""
        mq = pb.MessageQueue(id=queue_id, permission=_PERM[perm & (_READ | _WRITE)])
        mq.topic.name = tc.name
        mq.broker.name = group or self.deps.cfg.broker_name
        mq.broker.id = 0
        mq.broker.endpoints.CopyFrom(endpoints if endpoints is not None else self.endpoints())
        mq.accept_message_types.extend(_ACCEPT)
        return mq

    def placements(self, tc):
        """[(group, topic config there, master's Endpoints)] serving `tc` (rules 1, 5), or the
        refusal's Status."""
        if self.view is None:
            return [(None, tc, None)]
        found = []
        for group, doc, addr in self.view.grpc_masters(tc.name):
            try:
                found.append((group, TopicConfig.from_json(doc), self.endpoints(addr)))
            except (KeyError, TypeError, ValueError):
                log.warning("ignoring a bad topic config of %s in group %s", tc.name, group)
        if found:
            return found
        if self.deps.role.writable:   # created here just now: the view catches up later
            return [(None, tc, None)]
        return status(pb.Code.HA_NOT_AVAILABLE,
                      f"no broker group holding topic {tc.name!r} has a master now")

    def _topic_for(self, context, request, response_cls, group=None, perm=0):
        """(topic config, None), or (None, the refusal): ACL, then an unknown topic."""
        topic = request.topic.name
        denied = self.server.deny(context, topic, group, perm) if perm else \
            self.server.deny(context)
        if denied is not None:
            return None, response_cls(status=denied)
        tc = self.topic_config(topic)
        if tc is None and self.view is not None and self.view.grpc_masters(topic):
            tc = TopicConfig(topic, 0, 0)   # held by other groups only (rule 5)
        if tc is None:
            return None, response_cls(status=status(pb.Code.TOPIC_NOT_FOUND,
                                                         f"topic {topic!r} does not exist"))
        return tc, None

    async def query_route(self, request, context):
        tc, refused = self._topic_for(context, request, pb.QueryRouteResponse)
        if refused is not None:
            return refused
        placed = self.placements(tc)
        if isinstance(placed, pb.Status):
            return pb.QueryRouteResponse(status=placed)
        resp = pb.QueryRouteResponse(status=status(pb.Code.OK))
        for group, gtc, endpoints in placed:
            for qid in range(gtc.queue_count):
                perm = gtc.perm & ((_READ if qid < gtc.read_queue_nums else 0)
                                   | (_WRITE if qid < gtc.write_queue_nums else 0))
                resp.message_queues.append(self.queue(gtc, qid, perm, group, endpoints))
        return resp

    async def query_assignment(self, request, context):
        tc, refused = self._topic_for(context, request, pb.QueryAssignmentResponse,
                                      request.group.name, _SUB)
        if refused is not None:
            return refused
        placed = self.placements(tc)
        if isinstance(placed, pb.Status):
            return pb.QueryAssignmentResponse(status=placed)
        resp = pb.QueryAssignmentResponse(status=status(pb.Code.OK))
        for group, gtc, endpoints in placed:
            if gtc.perm & _READ:
                for qid in range(gtc.read_queue_nums):
                    resp.assignments.add().message_queue.CopyFrom(
                        self.queue(gtc, qid, _READ, group, endpoints))
        return resp

    async def heartbeat(self, request, context):
        return pb.HeartbeatResponse(status=self.server.deny(context) or status(pb.Code.OK))

    async def notify_client_termination(self, request, context):
        return pb.NotifyClientTerminationResponse(status=status(pb.Code.OK))

    def settings_for(self, settings):
        cfg = self.deps.cfg
        out = pb.Settings()
        out.CopyFrom(settings)
        policy = out.backoff_policy
        if settings.client_type == _PRODUCER:
            out.publishing.max_body_size = cfg.store.max_message_bytes
            if not policy.max_attempts:
                policy.max_attempts = 3
        else:
            sub = out.subscription
            wanted_ms = sub.long_polling_timeout.ToMilliseconds() or cfg.grpc_max_long_polling_ms
            sub.long_polling_timeout.FromMilliseconds(min(wanted_ms, cfg.grpc_max_long_polling_ms))
            sub.fifo = sub.group.name in self.fifo_groups()
            if not sub.receive_batch_size:
                sub.receive_batch_size = 32
            policy.max_attempts = cfg.grpc_max_delivery_attempts
            if policy.WhichOneof("strategy") is None:  # push consumers' retry delays
                policy.customized_backoff.SetInParent()
                for delay_ms in parse_levels(cfg.delay_levels):
                    policy.customized_backoff.next.add().FromMilliseconds(delay_ms)
        if policy.WhichOneof("strategy") is None:
            backoff = policy.exponential_backoff
            backoff.initial.FromMilliseconds(1000)
            backoff.max.FromMilliseconds(60_000)
            backoff.multiplier = 2.0
        return out

    def fifo_groups(self) -> set[str]:
        return {g.strip() for g in self.deps.cfg.grpc_fifo_groups.split(",") if g.strip()}

    async def telemetry(self, request_iterator, context):
        """Answer each Settings (rule 2); keep the stream for check-backs (rule 3)."""
        denied = self.server.deny(context)
        if denied is not None:
            await context.write(pb.TelemetryCommand(status=denied))
            return
        outbox: asyncio.Queue = asyncio.Queue(maxsize=1024)
        link = TelemetryLink(client_id_of(context), outbox, self.server)
        self.links.add(link)
        writer = asyncio.get_running_loop().create_task(self._write(context, outbox))
        try:
            async for command in request_iterator:
                if command is None or command.WhichOneof("command") != "settings":
                    continue
                settings = command.settings
                if settings.client_type == _PRODUCER:  # known topics only: bounded
                    table = self.deps.topics.table
                    self._register(link, [t.name for t in settings.publishing.topics
                                          if t.name in table][:MAX_TOPICS_PER_PRODUCER])
                reply = pb.TelemetryCommand(status=status(pb.Code.OK))
                reply.settings.CopyFrom(self.settings_for(settings))
                link.offer(reply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client went away mid-stream
            log.debug("telemetry stream of %s ended: %r", link.client_id, exc)
        finally:
            self._unregister(link)
            self.links.discard(link)
            link.closed = True
            writer.cancel()

    @staticmethod
    async def _write(context, outbox) -> None:
        while True:
            await context.write(await outbox.get())

    def _register(self, link, topics) -> None:
        producers = self.deps.clients.producers
        for group in link.groups - {producer_group_of(t) for t in topics}:
            producers.get(group, {}).pop(link, None)
        link.groups = {producer_group_of(t) for t in topics}
        for group in link.groups:
            producers.setdefault(group, {})[link] = None

    def _unregister(self, link) -> None:
        producers = self.deps.clients.producers
        for group in link.groups:
            members = producers.get(group)
            if members is not None:
                members.pop(link, None)
                if not members:
                    del producers[group]

    def close(self) -> None:
        for link in list(self.links):
            self._unregister(link)
            link.closed = True
