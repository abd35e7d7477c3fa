"""Topic routes for the SDK: fetching (GET_ROUTEINFO_BY_TOPIC, 105), caching and queue choice.

A standalone broker answers 105 itself; in cluster mode the addresses are name
servers. Either way the client asks one address (sticky) and moves to the next on failure, as
cpp does (its TcpRemotingClient.cpp).

Rules:
1. Sends go only to broker id 0 (the master); a QueueData counts for publishing only if it is
   WRITE-able and its broker has a master address (cpp's findBrokerAddressInPublish).
2. Consumers read queues 0..readQueueNums-1 of READ-able QueueData.
3. TOPIC_NOT_EXIST for a topic being published falls back to the default topic (TBW102) with
   each QueueData clamped to min(default_topic_queue_nums, its queue counts) (as Java's
   producer does; docs/protocol.md, Send); such
   an entry is marked `from_default` and replaced by the real route on the next refresh.
   Concurrent first sends share one fallback entry (one round-robin counter).
4. Concurrent refreshes of one topic share one request; a forced refresh is skipped if the
   route was fetched less than `MIN_REFRESH_GAP_S` ago (a burst of failures costs one query).
5. A route naming a group without a master (cluster mode, during an election) is fetched
   again every `degraded_route_refresh_s`; not-master, connection errors and request
   timeouts refresh at once.
6. master_moved(addr, groups): the producer's question about a master that stopped answering
   (client/stall_watch.py); `groups` are the broker groups it mastered when the stall began
   (groups_mastered_by). It re-fetches the routes that hold those groups and says whether one
   now names another master for them; a route without a master for the group is not a move
   (the election is still running: keep waiting).
7. A TopicPublishInfo is immutable but for its round-robin counter; when the table replaces
   or drops a topic's entry, the old one is marked `stale`, so a producer may keep the entry
   it last used and look the topic up again only once it went stale.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING, NamedTuple

from tidemq import errors
from tidemq.protocol.codes import PermName, RequestCode, ResponseCode
from tidemq.protocol.jhash import java_string_hash
from tidemq.protocol.remoting import ProtocolError
from tidemq.protocol.route_json import TopicRouteData, decode_topic_route

if TYPE_CHECKING:
    from tidemq.remoting_client import RemotingClient

log = logging.getLogger(__name__)

MIN_REFRESH_GAP_S = 0.1


class MessageQueue(NamedTuple):
    """One queue; sorts by (topic, broker_name, queue_id), the order rebalancing needs.

    A named tuple rather than a frozen dataclass: a consumer of 100,000 queues hashes these in
    every dict and set it keeps per queue, and a tuple's hash and equality run in C."""

    topic: str
    broker_name: str
    queue_id: int

    def key(self) -> str:
        return f"{self.topic}@{self.broker_name}@{self.queue_id}"

    def java_str(self) -> str:
        """Java's MessageQueue.toString(), hashed by the consistent-hash strategy."""
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"


class TopicPublishInfo:
    """Writable queues of a topic and their masters' addresses, with round-robin selection.
    `targets[i]` is (queues[i], its master's address); `rr` counts the round-robin picks made
    (select's, and the producer's fast path's: one sequence for both)."""

    __slots__ = ("topic", "queues", "master_addrs", "targets", "route", "from_default", "rr",
                 "stale")

    def __init__(self, topic: str, route: TopicRouteData,
                 default_queue_nums: int | None = None) -> None:
        self.topic = topic
        self.route = route
        self.from_default = default_queue_nums is not None
        masters = {b.broker_name: b.broker_addrs.get(0) for b in route.broker_datas}
        self.master_addrs = {name: addr for name, addr in masters.items() if addr}
        queues: list[MessageQueue] = []
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            if not qd.perm & PermName.WRITE or qd.broker_name not in self.master_addrs:
                continue
            count = qd.write_queue_nums
            if default_queue_nums is not None:
                count = min(default_queue_nums, qd.write_queue_nums, qd.read_queue_nums)
            queues.extend(MessageQueue(topic, qd.broker_name, i) for i in range(count))
        self.queues = queues
        # one address object for all topics (interned): a send hashes it, and thousands of
        # routes' own copies would each be a cache miss
        self.targets = tuple([(q, sys.intern(self.master_addrs[q.broker_name])) for q in queues])
        self.rr = 0
        self.stale = False  # replaced or dropped by the route table (rule 7)

    def select(self, prefer_broker: str | None = None) -> MessageQueue:
        """Round robin; with prefer_broker, the next queue of that broker group if it has one."""
        queues = self.queues
        if not queues:
            raise errors.NoRouteError(f"no writable queue for topic {self.topic!r}")
        at = self.rr
        self.rr = at + 1
        if prefer_broker is not None:
            same = [q for q in queues if q.broker_name == prefer_broker]
            if same:
                return same[at % len(same)]
        return queues[at % len(queues)]

    def select_by_key(self, key: object) -> MessageQueue:
        """The hash selector for ordered sends: one key, one queue (SelectMessageQueueByHash)."""
        queues = self.queues
        if not queues:
            raise errors.NoRouteError(f"no writable queue for topic {self.topic!r}")
        value = key if isinstance(key, int) else java_string_hash(str(key))
        return queues[abs(value) % len(queues)]


def subscribe_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    masters_or_any = {b.broker_name for b in route.broker_datas if b.broker_addrs}
    out: list[MessageQueue] = []
    for qd in route.queue_datas:
        if qd.perm & PermName.READ and qd.broker_name in masters_or_any:
            out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
    return sorted(out)


def _lacks_master(route: TopicRouteData) -> bool:
    """Whether a queue of the route belongs to a broker group without a master (rule 5)."""
    masters = {b.broker_name for b in route.broker_datas if b.broker_addrs.get(0)}
    return any(q.broker_name not in masters for q in route.queue_datas)


class RouteTable:
    """Route cache shared by one client's producers/consumers."""

    def __init__(self, remoting: RemotingClient, namesrv_addr: str, *,
                 route_timeout_s: float = 5.0, default_topic: str = "TBW102",
                 default_topic_queue_nums: int = 4) -> None:
        self._remoting = remoting
        self._namesrvs = [a.strip() for a in namesrv_addr.split(";") if a.strip()]
        self._namesrv_index = 0
        self._timeout_s = route_timeout_s
        self._default_topic = default_topic
        self._default_queue_nums = default_topic_queue_nums
        self.routes: dict[str, TopicRouteData] = {}
        self._publish: dict[str, TopicPublishInfo] = {}
        self._fetched_at: dict[str, float] = {}  # topic -> loop time
        self._inflight: dict[str, asyncio.Future[None]] = {}  # topic -> a refresh under way
        # broker name -> {broker id: addr}, merged over all routes
        self.broker_addrs: dict[str, dict[int, str]] = {}
        # topics whose route names a group without a master (rule 5), kept as routes are
        # installed: the timer looks at these, not at every route (a consumer may hold 12,500)
        self._degraded: set[str] = set()

    # ------------------------------------------------------------------ queries
    async def query_route(self, topic: str) -> TopicRouteData | None:
        """The TopicRouteData, or None on TOPIC_NOT_EXIST. Tries each name server in turn."""
        last_exc: Exception | None = None
        for _ in range(len(self._namesrvs)):
            addr = self._namesrvs[self._namesrv_index % len(self._namesrvs)]
            cmd = self._remoting.command(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            try:
                resp = await self._remoting.invoke(addr, cmd, self._timeout_s)
            except (errors.ConnectionError, errors.RequestTimeout, errors.ProtocolViolation) as exc:
                last_exc = exc
                self._namesrv_index += 1  # sticky until it fails, as cpp
                continue
            if resp.code == ResponseCode.TOPIC_NOT_EXIST:
                return None
            if resp.code != ResponseCode.SUCCESS:
                raise errors.error_for_response(resp, addr=addr, what=f"route of {topic!r}")
            try:
                return decode_topic_route(resp.body)
            except ProtocolError as exc:
                raise errors.ProtocolViolation(f"bad route for {topic!r} from {addr}: {exc}") from None
        raise last_exc  # type: ignore[misc]  # set: the config names at least one address

    async def refresh(self, topic: str, *, force: bool = True) -> None:
        """Fetch the topic's route now (shared by concurrent callers; rule 4)."""
        loop = asyncio.get_running_loop()
        if not force and topic in self.routes:
            return
        fetched = self._fetched_at.get(topic)
        if fetched is not None and loop.time() - fetched < MIN_REFRESH_GAP_S and topic in self.routes:
            return
        fut = self._inflight.get(topic)
        if fut is None:
            fut = asyncio.ensure_future(self._refresh(topic))
            self._inflight[topic] = fut
            fut.add_done_callback(lambda _f: self._inflight.pop(topic, None))
        await asyncio.shield(fut)

    async def _refresh(self, topic: str) -> None:
        route = await self.query_route(topic)
        loop = asyncio.get_running_loop()
        self._fetched_at[topic] = loop.time()
        if route is None:
            self.forget(topic)
            return
        self._install(topic, route)

    def _install(self, topic: str, route: TopicRouteData) -> None:
        self.routes[topic] = route
        for b in route.broker_datas:
            self.broker_addrs[b.broker_name] = dict(b.broker_addrs)
        self._set_publish(topic, TopicPublishInfo(topic, route))
        if _lacks_master(route):
            self._degraded.add(topic)
        else:
            self._degraded.discard(topic)

    async def refresh_degraded(self) -> None:
        """Re-fetch routes that name a broker group without a master (an election is under
        way, rule 5): its queues come back as soon as the new master is published, not on
        the 30 s timer."""
        for topic in [t for t in self._degraded if t in self.routes]:
            try:
                await self.refresh(topic, force=True)
            except errors.TideMQError as exc:
                log.info("route refresh of %r failed: %s", topic, exc)

    def groups_mastered_by(self, addr: str) -> set[str]:
        return {name for info in self._publish.values()
                for name, a in info.master_addrs.items() if a == addr}

    async def master_moved(self, addr: str, groups: set[str]) -> bool:
        """Rule 6."""
        topics = [t for t, info in self._publish.items()
                  if any(b.broker_name in groups for b in info.route.broker_datas)]
        for topic in topics:
            try:
                await self.refresh(topic, force=True)
            except errors.TideMQError as exc:
                log.info("route refresh of %r failed: %s", topic, exc)
        return any(self.master_addr(g) not in (None, addr) for g in groups)

    async def refresh_all(self) -> None:
        for topic in list(self.routes) + [t for t in self._publish if t not in self.routes]:
            try:
                await self.refresh(topic, force=True)
            except errors.TideMQError as exc:
                log.warning("route refresh of %r failed: %s", topic, exc)

    # ------------------------------------------------------------------ producers
    def publish_info_nowait(self, topic: str) -> TopicPublishInfo | None:
        return self._publish.get(topic)

    async def publish_info(self, topic: str) -> TopicPublishInfo:
        info = self._publish.get(topic)
        if info is not None and info.queues:
            return info
        await self.refresh(topic)
        info = self._publish.get(topic)
        if info is not None and info.queues:
            return info
        # Unknown topic: publish through the default topic's queues (rule 3).
        default = await self.query_route(self._default_topic)
        if default is None:
            raise errors.TopicNotExist(f"topic {topic!r} does not exist and auto-creation through "
                                       f"{self._default_topic!r} is not offered",
                                       code=ResponseCode.TOPIC_NOT_EXIST)
        # Concurrent first sends each awaited their own default query: the first to get here
        # installs the fallback and the rest share it, so the round robin spreads them. (A
        # fresh TopicPublishInfo per send would start its counter at 0: a burst of send_async
        # calls would all go to the first queue of the first broker group.)
        info = self._publish.get(topic)
        if info is not None and info.queues:
            return info
        for b in default.broker_datas:
            self.broker_addrs.setdefault(b.broker_name, dict(b.broker_addrs))
        info = TopicPublishInfo(topic, default, self._default_queue_nums)
        if not info.queues:
            raise errors.NoRouteError(f"no writable queue for {topic!r} (via {self._default_topic})")
        self._set_publish(topic, info)
        return info

    def _set_publish(self, topic: str, info: TopicPublishInfo | None) -> None:
        """Install (or, with None, drop) the topic's publish info; the old one goes stale."""
        old = self._publish.pop(topic, None) if info is None else self._publish.get(topic)
        if info is not None:
            self._publish[topic] = info
        if old is not None and old is not info:
            old.stale = True

    # ------------------------------------------------------------------ consumers and admin
    async def subscribe_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        if refresh or topic not in self.routes:
            await self.refresh(topic)
        route = self.routes.get(topic)
        if route is None:
            raise errors.TopicNotExist(f"topic {topic!r} does not exist",
                                       code=ResponseCode.TOPIC_NOT_EXIST)
        return subscribe_queues(topic, route)

    def master_addr(self, broker_name: str) -> str | None:
        addrs = self.broker_addrs.get(broker_name) or {}
        return addrs.get(0)

    def read_addr(self, broker_name: str) -> str | None:
        """The master if known, else the lowest broker id (offset and admin calls, as cpp)."""
        addrs = self.broker_addrs.get(broker_name) or {}
        if not addrs:
            return None
        return addrs.get(0) or addrs[min(addrs)]

    def brokers_of(self, topic: str) -> list[str]:
        route = self.routes.get(topic)
        if route is None:
            info = self._publish.get(topic)
            route = info.route if info else None
        if route is None:
            return []
        out: list[str] = []
        for b in sorted(route.broker_datas, key=lambda b: b.broker_name):
            addr = b.broker_addrs.get(0) or (b.broker_addrs[min(b.broker_addrs)] if b.broker_addrs else None)
            if addr:
                out.append(addr)
        return out

    def all_broker_addrs(self) -> list[str]:
        out: set[str] = set()
        for addrs in self.broker_addrs.values():
            out.update(addrs.values())
        return sorted(out)

    def forget(self, topic: str) -> None:
        self.routes.pop(topic, None)
        self._set_publish(topic, None)
        self._degraded.discard(topic)
