"""Admin calls against one broker or name server: topics (17, 21, 202 or 29-31), message
queries (12, 33), runtime info (28), the name server's listings (106, 206). Used by the
`tidemq` CLI and by tests; client/admin_fanout.py runs them on every broker group.

Rules:
0. The address may be a `;` list (several name servers, as clients take them): requests go to
   the first and move to the next when a connection fails, as the route table does.
1. `topic_stats` prefers GET_TOPIC_STATS_INFO (202); if the broker does not support it, it
   falls back to GET_MIN_OFFSET / GET_MAX_OFFSET per queue of the route.
2. A message id is tried as an offsetMsgId (33, read from the broker it names only if that is
   the broker we talk to) and, with a topic, as a UNIQ_KEY (12 with `_UNIQUE_KEY_QUERY`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Container
from typing import Any

from tidemq import errors
from tidemq.config import ClientConfig, make_config
from tidemq.consumer import broker_calls as pull_api
from tidemq.instance import ClientInstance
from tidemq.message import MessageExt, split_records
from tidemq.protocol.codes import PERM_READ_WRITE, RequestCode, ResponseCode
from tidemq.protocol.record import RecordError, decode_offset_msg_id
from tidemq.protocol.remoting import RemotingCommand
from tidemq.protocol.route_json import HeartbeatData, TopicRouteData
from tidemq.topic_routes import subscribe_queues

QUERY_MAX_NUM = 64


class Admin:
    def __init__(self, broker_addr: str, **options: Any) -> None:
        self.addrs = split_addrs(broker_addr)
        self.broker_addr = self.addrs[0]
        self.config = make_config(ClientConfig, namesrv_addr=";".join(self.addrs), **options)
        self._instance: ClientInstance = None  # type: ignore[assignment]  # set by __aenter__

    async def __aenter__(self) -> Admin:
        self._instance = ClientInstance(self.config, lambda: HeartbeatData(self._instance.client_id))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._instance.close()

    async def _call(self, code: int, ext: dict[str, Any] | None = None, body: bytes = b"", *,
                    ok: Container[int] = (0,), what: str | None = None,
                    timeout_s: float | None = None) -> RemotingCommand:
        """Rule 0: the next address of the list when this one cannot be reached."""
        for tries_left in range(len(self.addrs) - 1, -1, -1):
            try:
                return await self._instance.call(self.broker_addr, code, ext, body, ok=ok,
                                                 what=what, timeout_s=timeout_s)
            except errors.ConnectionError:
                if not tries_left:
                    raise
                at = self.addrs.index(self.broker_addr)
                self.broker_addr = self.addrs[(at + 1) % len(self.addrs)]
        raise AssertionError("unreachable: the last try returns or raises")

    async def create_topic(self, topic: str, queues: int = 8, *, read_queues: int | None = None,
                           write_queues: int | None = None, perm: int = PERM_READ_WRITE,
                           order: bool = False) -> None:
        ext = {"topic": topic, "defaultTopic": "TBW102",
               "readQueueNums": str(read_queues or queues), "writeQueueNums": str(write_queues or queues),
               "perm": str(int(perm)), "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0",
               "order": "true" if order else "false"}
        await self._call(RequestCode.UPDATE_AND_CREATE_TOPIC, ext, what=f"create topic {topic!r}")

    async def cluster_brokers(self) -> dict[str, dict[int, str]] | None:
        """{group: {broker id: address}} when this address is a TideMQ name server (106), else
        None (a broker: routes and topics are its own)."""
        resp = await self._call(RequestCode.GET_BROKER_CLUSTER_INFO, what="cluster info",
                                ok=(ResponseCode.SUCCESS, ResponseCode.REQUEST_CODE_NOT_SUPPORTED))
        if resp.code != ResponseCode.SUCCESS:
            return None
        table = _json(resp.body).get("brokerAddrTable") or {}
        return {name: {int(k): v for k, v in (b.get("brokerAddrs") or {}).items() if v}
                for name, b in table.items()}

    async def cluster_masters(self) -> dict[str, str | None] | None:
        """{group: master address or None} from a name server, else None."""
        brokers = await self.cluster_brokers()
        if brokers is None:
            return None
        return {name: addrs.get(0) for name, addrs in brokers.items()}

    async def topic_list(self) -> list[str]:
        """GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206) from a name server."""
        resp = await self._call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, what="list topics")
        topics: list[str] = sorted(_json(resp.body).get("topicList") or [])
        return topics

    async def topic_configs(self) -> dict[str, Any]:
        resp = await self._call(RequestCode.GET_ALL_TOPIC_CONFIG, what="list topics")
        doc = _json(resp.body)
        configs: dict[str, Any] = doc.get("topicConfigTable") or {}
        return configs

    async def topic_stats(self, topic: str) -> list[dict[str, Any]]:
        """[{"broker", "queue_id", "min_offset", "max_offset", "last_update_ms"}] per queue."""
        resp = await self._call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic},
                                ok=(ResponseCode.SUCCESS, ResponseCode.REQUEST_CODE_NOT_SUPPORTED),
                                what=f"stats of {topic!r}")
        if resp.code == ResponseCode.SUCCESS and resp.body:
            rows = _stats_rows(_json(resp.body))
            if rows is not None:
                return rows
        route = await self._instance.routes.query_route(topic)
        if route is None:
            raise errors.TopicNotExist(f"topic {topic!r} does not exist", code=ResponseCode.TOPIC_NOT_EXIST)
        rows = []
        for mq in subscribe_queues(topic, route):
            lo = await pull_api.queue_offset(self._instance, self.broker_addr, mq, "min")
            hi = await pull_api.queue_offset(self._instance, self.broker_addr, mq, "max")
            rows.append({"broker": mq.broker_name, "queue_id": mq.queue_id, "min_offset": lo,
                         "max_offset": hi})
        return rows

    async def consumer_progress(self, group: str, topic: str | None = None) -> dict[str, Any]:
        """GET_CONSUME_STATS (208): {"group", "queues": [{"topic", "broker", "queue_id",
        "broker_offset", "consumer_offset", "lag"}], "broadcast": [the same + "client_id"]}.
        "queues" has every queue of the topics the group subscribes to or committed on;
        consumer_offset -1 where it never committed (node/consumers/progress.py)."""
        ext = {"consumerGroup": group}
        if topic:
            ext["topic"] = topic
        resp = await self._call(RequestCode.GET_CONSUME_STATS, ext, what=f"progress of {group!r}")
        doc = _json(resp.body)
        rows: list[dict[str, Any]] = []
        for key, val in (doc.get("offsetTable") or {}).items():
            mq = json.loads(key) if isinstance(key, str) and key.startswith("{") else {}
            rows.append(_progress_row(mq.get("topic"), mq.get("brokerName"), mq.get("queueId"), val))
        members = [dict(_progress_row(e.get("topic"), e.get("brokerName"), e.get("queueId"), e),
                        client_id=e.get("clientId"))
                   for e in doc.get("broadcastOffsetTable") or ()]
        order: Callable[[dict[str, Any]], tuple[Any, ...]] = \
            lambda r: (str(r["topic"]), str(r["broker"]), r["queue_id"])  # noqa: E731
        return {"group": group, "queues": sorted(rows, key=order),
                "broadcast": sorted(members, key=lambda r: (str(r["client_id"]),) + order(r))}

    async def subscription_groups(self) -> dict[str, Any]:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201): {group: Java SubscriptionGroupConfig dict}."""
        resp = await self._call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, what="list groups")
        groups: dict[str, Any] = _json(resp.body).get("subscriptionGroupTable") or {}
        return groups

    async def update_subscription_group(self, group: str, **settings: Any) -> dict[str, Any]:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200): `settings` by their Java names
        (consumeEnable=False, retryMaxTimes=3, ...); fields left out keep their value.
        Returns the group's stored config."""
        body = json.dumps(dict(settings, groupName=group)).encode()
        resp = await self._call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body,
                                what=f"update group {group!r}")
        stored: dict[str, Any] = _json(resp.body)
        return stored

    # -- operator commands (node/processors/ops.py) ------------------------------------------
    async def reset_offsets(self, group: str, topic: str, timestamp_ms: float, *,
                            force: bool = True) -> dict[int, int]:
        """INVOKE_BROKER_TO_RESET_OFFSET (222): every queue of `topic` to its first message
        stored at or after `timestamp_ms` (0 = earliest; a future time = latest). Returns
        {queue_id: new offset}; live consumers of the group are told by the broker (220)."""
        ext = {"topic": topic, "group": group, "timestamp": str(int(timestamp_ms)),
               "isForce": "true" if force else "false"}
        resp = await self._call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext,
                                what=f"reset {group!r} on {topic!r}")
        table = _json(resp.body).get("offsetTable") or {}
        return {int(json.loads(k)["queueId"]): int(v) for k, v in table.items()}

    async def delete_topic(self, topic: str) -> None:
        await self._call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic},
                         what=f"delete topic {topic!r}")

    async def delete_group(self, group: str) -> None:
        await self._call(RequestCode.DELETE_SUBSCRIPTIONGROUP,
                         {"groupName": group, "cleanOffset": "true"},
                         what=f"delete group {group!r}")

    async def topic_route(self, topic: str) -> TopicRouteData | None:
        """GET_ROUTEINFO_BY_TOPIC (105): the TopicRouteData, or None when the topic has none."""
        return await self._instance.routes.query_route(topic)

    async def cluster_info(self) -> dict[str, Any]:
        """GET_BROKER_CLUSTER_INFO (106) from a name server or a standalone broker:
        {"brokerAddrTable": {...}, "clusterAddrTable": {...}}."""
        resp = await self._call(RequestCode.GET_BROKER_CLUSTER_INFO, what="cluster info")
        info: dict[str, Any] = _json(resp.body)
        return info

    async def runtime_info_of(self, addr: str) -> dict[str, Any]:
        """GET_BROKER_RUNTIME_INFO (28) of another broker (e.g. one named by cluster_info)."""
        resp = await self._instance.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO,
                                         what=f"runtime info of {addr}")
        table: dict[str, Any] = _json(resp.body).get("table") or {}
        return table

    async def runtime_info(self) -> dict[str, Any]:
        resp = await self._call(RequestCode.GET_BROKER_RUNTIME_INFO, what="runtime info")
        table: dict[str, Any] = _json(resp.body).get("table") or {}
        return table

    async def query_by_key(self, topic: str, key: str, max_num: int = QUERY_MAX_NUM, *,
                           unique: bool = False, begin_ms: int = 0,
                           end_ms: int | None = None) -> list[MessageExt]:
        ext = {"topic": topic, "key": key, "maxNum": str(max_num), "beginTimestamp": str(begin_ms),
               "endTimestamp": str(end_ms if end_ms is not None else int(time.time() * 1000) + 60_000)}
        if unique:
            ext["_UNIQUE_KEY_QUERY"] = "true"
        resp = await self._call(RequestCode.QUERY_MESSAGE, ext,
                                ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
                                what=f"query {topic!r} key {key!r}")
        if resp.code == ResponseCode.QUERY_NOT_FOUND or not resp.body:
            return []
        msgs = split_records(resp.body)
        if unique:
            return [m for m in msgs if m.uniq_key == key]
        return [m for m in msgs if key in m.keys or m.uniq_key == key]

    async def view_by_offset_id(self, msg_id: str, addr: str | None = None) -> MessageExt:
        """33 on `addr` (default: the address this Admin talks to)."""
        try:
            _ip, _port, offset = decode_offset_msg_id(msg_id)
        except RecordError as exc:
            raise errors.IllegalArgument(str(exc)) from None
        resp = await self._instance.call(addr or self.broker_addr, RequestCode.VIEW_MESSAGE_BY_ID,
                                         {"offset": str(offset)}, what=f"view message {msg_id}")
        msgs = split_records(resp.body)
        if len(msgs) != 1:
            raise errors.ProtocolViolation(f"view of {msg_id} returned {len(msgs)} records")
        return msgs[0]

    async def parked_transactions(
            self, begin_offset: int = 0,
            max_num: int = 32) -> tuple[list[MessageExt], int, int, int]:
        """Half messages parked after the check maximum (TideMQ's code 9001):
        (messages, next offset, min offset, max offset)."""
        resp = await self._call(RequestCode.GET_PARKED_TRANSACTIONS,
                                {"beginOffset": str(begin_offset), "maxNum": str(max_num)},
                                what="list parked transactions")
        ext = resp.ext or {}
        return (split_records(resp.body) if resp.body else [], int(ext.get("nextBeginOffset", 0)),
                int(ext.get("minOffset", 0)), int(ext.get("maxOffset", 0)))

    async def query_by_id(self, msg_id: str, topic: str | None = None) -> list[MessageExt]:
        """Rule 2: offsetMsgId first, then UNIQ_KEY within `topic`."""
        found: list[MessageExt] = []
        try:
            msg = await self.view_by_offset_id(msg_id)
            if msg.offset_msg_id == msg_id.upper():
                found.append(msg)
        except (errors.BrokerError, errors.IllegalArgument, errors.ProtocolViolation):
            pass
        if not found and topic:
            found = await self.query_by_key(topic, msg_id, unique=True)
        return found


def split_addrs(text: object) -> list[str]:
    """"a:1;b:2" (also "," or spaces between) -> ["a:1", "b:2"]; an empty list is an error."""
    addrs = [a for a in str(text or "").replace(",", ";").replace(" ", ";").split(";") if a]
    if not addrs:
        raise errors.IllegalArgument("no broker or name server address given")
    return addrs


def _progress_row(topic: str | None, broker: str | None, queue_id: int | str | None,
                  val: dict[str, Any]) -> dict[str, Any]:
    """consumer_offset -1: the group never committed on the queue. The lag is the broker's
    (it counts from the min offset when retention deleted past the commit); a broker that
    does not send it (Java) gets max offset minus the commit."""
    top, mine = int(val.get("brokerOffset", 0)), int(val.get("consumerOffset", 0))
    lag = int(val["lag"]) if "lag" in val else max(top - max(mine, 0), 0)
    return {"topic": topic, "broker": broker, "queue_id": int(queue_id if queue_id is not None else -1),
            "broker_offset": top, "consumer_offset": mine, "lag": lag,
            "last_consume_ms": int(val.get("lastTimestamp", 0))}


def _json(body: bytes) -> Any:
    try:
        return json.loads(bytes(body).decode("utf-8"))
    except ValueError as exc:
        raise errors.ProtocolViolation(f"bad JSON body: {exc}") from None


def _stats_rows(doc: object) -> list[dict[str, Any]] | None:
    """TopicStatsTable in standard JSON: {"offsetTable": {<mq>: {...}}} where <mq> is a JSON
    object text or "topic@broker@qid"; None if the shape is not recognised."""
    table = doc.get("offsetTable") if isinstance(doc, dict) else None
    if not isinstance(table, (dict, list)):
        return None
    items = table.items() if isinstance(table, dict) else [(e.get("messageQueue"), e) for e in table]
    rows: list[dict[str, Any]] = []
    for key, val in items:
        mq = key
        if isinstance(key, str):
            try:
                mq = json.loads(key)
            except ValueError:
                parts = key.split("@")
                mq = {"brokerName": parts[1] if len(parts) > 2 else "", "queueId": parts[-1]}
        if not isinstance(mq, dict) or not isinstance(val, dict):
            return None
        rows.append({"broker": mq.get("brokerName"), "queue_id": int(mq.get("queueId", -1)),
                     "min_offset": int(val.get("minOffset", -1)), "max_offset": int(val.get("maxOffset", -1)),
                     "last_update_ms": int(val.get("lastUpdateTimestamp", 0))})
    return sorted(rows, key=lambda r: (str(r["broker"]), r["queue_id"]))
