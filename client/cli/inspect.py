"""`tidemq` inspection commands next to mqadmin's: broker status and client connections.

    broker status                     28 GET_BROKER_RUNTIME_INFO of every broker (every member
                                      of every group through name servers)
    consumer connections GROUP        203: clients, addresses, languages, subscriptions
    producer connections GROUP        204: clients of a producer group

Rules:
1. Through name servers every group is asked (connections: every member, since clients talk
   to masters and slaves alike) and the answers merged; a group where the group is not
   connected is skipped, and "not online" is an error only when no broker knows it.
2. A broker that does not answer appears with role UNREACHABLE and the error, instead of
   failing the whole listing.
"""
from __future__ import annotations

import json
from argparse import ArgumentParser, Namespace
from typing import TYPE_CHECKING, Any

from tidemq import errors
from tidemq.protocol.codes import RequestCode, ResponseCode

if TYPE_CHECKING:
    from argparse import _SubParsersAction

    from tidemq.admin import Admin
    from tidemq.cli.main import Common

# runtime-info keys shown by `broker status` on a terminal (JSON output has them all)
STATUS_KEYS = ("brokerRole", "haEpoch", "commitLogMaxOffset", "msgPutTotalTodayNow",
               "msgGetTotalTodayNow", "brokerVersionDesc")


def add_parsers(sub: _SubParsersAction[ArgumentParser], common: type[Common],
                consumer_sub: _SubParsersAction[ArgumentParser]) -> None:
    broker = sub.add_parser("brokers", help="broker runtime status (mqadmin brokerStatus)",
                            **common.fmt)
    bsub = broker.add_subparsers(dest="brokers_command", required=True, metavar="ACTION")
    status = bsub.add_parser("status", help="runtime info of every broker", **common.fmt)
    status.add_argument("--all-keys", action="store_true", help="every runtime key, not a summary")
    conns = consumer_sub.add_parser("connections", help="connected clients and subscriptions "
                                    "of a consumer group", **common.fmt)
    conns.add_argument("group", help="consumer group")
    producer = sub.add_parser("producer", help="producer groups", **common.fmt)
    psub = producer.add_subparsers(dest="producer_command", required=True, metavar="ACTION")
    pconns = psub.add_parser("connections", help="connected clients of a producer group",
                             **common.fmt)
    pconns.add_argument("group", help="producer group")
    for p in (status, conns, pconns):
        common.add(p)


async def dispatch(args: Namespace) -> dict[str, Any]:
    from tidemq.admin import Admin
    async with Admin(args.broker) as admin:
        if args.command == "brokers":
            return await broker_status(admin, args.all_keys)
        kind = "consumer" if args.command == "consumer" else "producer"
        return await connections(admin, kind, args.group)


async def _members(admin: Admin) -> list[tuple[str, int, str]]:
    """(group, broker id, address) of every broker ADDR leads to."""
    brokers = await admin.cluster_brokers()
    if brokers is None:
        rt = await admin.runtime_info()
        return [(rt.get("brokerName", "?"), 0, admin.broker_addr)]
    return [(g, i, addr) for g, ids in sorted(brokers.items()) for i, addr in sorted(ids.items())]


async def broker_status(admin: Admin, all_keys: bool = False) -> dict[str, Any]:
    rows = []
    for group, broker_id, addr in await _members(admin):
        row: dict[str, Any] = {"broker_group": group, "broker_id": broker_id, "addr": addr}
        try:
            rt = await admin.runtime_info_of(addr)
            keys = sorted(rt) if all_keys else STATUS_KEYS
            row.update({k: rt.get(k) for k in keys})
        except errors.TideMQError as exc:
            row.update(brokerRole="UNREACHABLE", error=str(exc))
        rows.append(row)
    return {"brokers": rows}


async def connections(admin: Admin, kind: str, group: str) -> dict[str, Any]:
    code: int = (RequestCode.GET_CONSUMER_CONNECTION_LIST if kind == "consumer"
            else RequestCode.GET_PRODUCER_CONNECTION_LIST)
    ext = {"consumerGroup" if kind == "consumer" else "producerGroup": group}
    rows: list[dict[str, Any]] = []
    subs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for bgroup, broker_id, addr in await _members(admin):
        try:
            resp = await admin._instance.call(addr, code, ext, what=f"{kind} connections of "
                                              f"{group!r} on {addr}")
        except (errors.ConsumerNotOnline, errors.SystemError):
            continue
        except errors.ConnectionError:
            continue
        doc = json.loads(bytes(resp.body).decode())
        for c in doc.get("connectionSet") or ():
            rows.append({"broker_group": bgroup, "broker_id": broker_id, "client_id": c.get("clientId"),
                         "client_addr": c.get("clientAddr"), "language": c.get("language"),
                         "version": c.get("version")})
        for topic, sd in (doc.get("subscriptionTable") or {}).items():
            subs[topic] = sd.get("subString")
        for k in ("consumeType", "messageModel", "consumeFromWhere"):
            if doc.get(k) is not None:
                extra[k] = doc[k]
    if not rows:
        code = ResponseCode.CONSUMER_NOT_ONLINE if kind == "consumer" else ResponseCode.SYSTEM_ERROR
        raise errors.error_for_code(code, f"no {kind} of group {group!r} is connected to any "
                                    f"broker")
    out: dict[str, Any] = {"group": group, "connections": rows}
    if kind == "consumer":
        out.update(subscriptions=subs, **extra)
    return out
