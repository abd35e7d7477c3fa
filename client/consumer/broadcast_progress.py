"""Broadcasting progress kept on the broker per (group, client id), with the local file as the
fallback (node/consumers/broadcast_progress.py is the broker's side).

Rules:
1. `read` asks the broker first (QUERY_CONSUMER_OFFSET with `broadcastClientId`): it survives the
   loss of this machine's disk as long as the client id is kept (set `instance_name`). When the
   broker has nothing or cannot be asked, the local file answers.
2. `persist` writes the local file first (always available), then commits what changed to the
   broker; a failed commit is logged and retried at the next persist.
3. Only a broker that echoes `broadcastClientId` in a query reply keeps member offsets; a broker
   that does not (RocketMQ's, which ignores the field) would read and write the GROUP's offset,
   so its answers are not used and nothing is committed to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import TYPE_CHECKING

from tidemq import errors
from tidemq.consumer.offset_store import LocalFileOffsetStore
from tidemq.protocol.codes import RequestCode, ResponseCode

if TYPE_CHECKING:
    from tidemq.instance import ClientInstance
    from tidemq.topic_routes import MessageQueue

log = logging.getLogger(__name__)
EXT_CLIENT_ID = "broadcastClientId"


class BroadcastOffsetStore(LocalFileOffsetStore):
    def __init__(self, instance: ClientInstance, directory: str, group: str) -> None:
        super().__init__(directory, instance.client_id, group)
        self._instance = instance
        self._group = group
        self._on_broker: dict[MessageQueue, int] = {}  # the offsets the broker has
        self._keeps_members: dict[str | None, bool] = {}  # broker address -> it echoed broadcastClientId (rule 3)

    def _addr(self, mq: MessageQueue) -> str | None:
        routes = self._instance.routes
        addr: str | None = routes.master_addr(mq.broker_name) or routes.read_addr(mq.broker_name)
        return addr

    def _ext(self, mq: MessageQueue, **more: str) -> dict[str, str]:
        return {"consumerGroup": self._group, "topic": mq.topic, "queueId": str(mq.queue_id),
                EXT_CLIENT_ID: self._instance.client_id, **more}

    async def read(self, mq: MessageQueue) -> int:
        addr = self._addr(mq)
        if addr is not None:
            try:
                resp = await self._instance.call(
                    addr, RequestCode.QUERY_CONSUMER_OFFSET, self._ext(mq), timeout_s=3.0,
                    ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
                    what=f"broadcast offset of {mq}")
                echoed = resp.ext.get(EXT_CLIENT_ID) == self._instance.client_id
                if echoed:
                    self._keeps_members[addr] = True
                if resp.code == ResponseCode.SUCCESS and echoed:
                    offset = int(resp.ext.get("offset", -1))
                    if offset >= 0:
                        self._on_broker[mq] = offset
                        self._table.update(mq, offset, allow_backwards=True)
                        self._table.persisted[mq] = offset
                        return offset
            except (errors.TideMQError, ValueError) as exc:
                log.warning("broadcast offset of %s not read from the broker: %s", mq, exc)
        return await super().read(mq)

    async def persist(self, mqs: Collection[MessageQueue] | None = None) -> int:
        done = await super().persist(mqs)
        changed = {mq: off for mq, off in self._table.offsets.items()
                   if self._on_broker.get(mq) != off and (mqs is None or mq in mqs)
                   and self._keeps_members.get(self._addr(mq))}
        results = await asyncio.gather(*[self._commit(mq, off) for mq, off in changed.items()],
                                       return_exceptions=True)
        for (mq, off), res in zip(changed.items(), results):
            if isinstance(res, BaseException):
                if not isinstance(res, errors.TideMQError):
                    raise res
                log.warning("broadcast offset %s=%d not committed to the broker: %s", mq, off, res)
            else:
                self._on_broker[mq] = off
        return done

    async def _commit(self, mq: MessageQueue, offset: int) -> None:
        addr = self._addr(mq)
        if addr is None:
            raise errors.NoRouteError(f"no address for broker {mq.broker_name!r}")
        await self._instance.call(addr, RequestCode.UPDATE_CONSUMER_OFFSET,
                                  self._ext(mq, commitOffset=str(offset)), timeout_s=3.0,
                                  what=f"commit broadcast offset of {mq}")

    def remove(self, mq: MessageQueue) -> None:
        super().remove(mq)
        self._on_broker.pop(mq, None)
