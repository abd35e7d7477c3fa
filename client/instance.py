"""What every producer and consumer owns: a client id, a connection pool, a route table,
background timers (route refresh, heartbeat) and the tasks it started.

Rules:
1. Every background task is started through `spawn`, so `close` cancels all of them and a task
   that dies of an unexpected exception is logged, never silently lost.
2. Timers run their first round after one interval; owners call `heartbeat()` / route
   fetches themselves at start, where the order matters.
3. The client id is "ip@instance" (Java's form); the instance name defaults to "<pid>#<n>"
   so that several clients in one process are distinct group members.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Awaitable, Callable, Container, Coroutine, Iterable
from typing import Any, TypeVar

from tidemq import errors, security
from tidemq.config import ClientConfig
from tidemq.message import local_ip
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.remoting import RemotingCommand
from tidemq.protocol.route_json import HeartbeatData, encode_heartbeat
from tidemq.remoting_client import RemotingClient
from tidemq.topic_routes import RouteTable

log = logging.getLogger(__name__)

_instance_numbers = itertools.count(1)
_T = TypeVar("_T")


def default_instance_name() -> str:
    return f"{os.getpid()}#{next(_instance_numbers)}"


class ClientInstance:
    def __init__(self, config: ClientConfig, heartbeat_data: Callable[[], HeartbeatData], *,
                 default_topic: str = "TBW102", default_topic_queue_nums: int = 4) -> None:
        self.config = config
        self.client_ip = config.client_ip or local_ip()
        self.instance_name = config.instance_name or default_instance_name()
        self.client_id = f"{self.client_ip}@{self.instance_name}"
        self.remoting = RemotingClient(
            header_format=config.header_format, connect_timeout_s=config.connect_timeout_s,
            request_timeout_s=config.request_timeout_s,
            timeout_sweep_interval_s=config.timeout_sweep_interval_s,
            security=config.security or security.default())
        self.routes = RouteTable(self.remoting, config.namesrv_addr,
                                 route_timeout_s=config.route_timeout_s, default_topic=default_topic,
                                 default_topic_queue_nums=default_topic_queue_nums)
        self._heartbeat_data = heartbeat_data  # () -> HeartbeatData
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    # ------------------------------------------------------------------ tasks
    def spawn(self, coro: Coroutine[Any, Any, _T], name: str | None = None) -> asyncio.Task[_T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: background task %s died: %r", self.client_id, task.get_name(),
                      task.exception(), exc_info=task.exception())

    def every(self, interval_s: float, fn: Callable[[], Awaitable[object]],
              name: str) -> asyncio.Task[None]:
        """Run `await fn()` every interval_s until closed; errors are logged, not fatal."""
        async def loop() -> None:
            while not self.closed:
                await asyncio.sleep(interval_s)
                try:
                    await fn()
                except errors.TideMQError as exc:
                    log.warning("%s: %s failed: %s", self.client_id, name, exc)
        return self.spawn(loop(), name=name)

    def start_timers(self) -> None:
        self.every(self.config.route_refresh_interval_s, self.routes.refresh_all, "route-refresh")
        self.every(self.config.heartbeat_interval_s, self.heartbeat, "heartbeat")
        self.every(self.config.degraded_route_refresh_s, self.routes.refresh_degraded,
                   "route-refresh-degraded")

    async def close(self) -> None:
        self.closed = True
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.remoting.close()

    # ------------------------------------------------------------------ broker calls
    async def call(self, addr: str, code: int, ext: dict[str, Any] | None = None,
                   body: bytes = b"", *, timeout_s: float | None = None, what: str | None = None,
                   ok: Container[int] = (0,)) -> RemotingCommand:
        """Request/response; a response code outside `ok` raises its catalogue error."""
        cmd = self.remoting.command(code, ext, body)
        resp = await self.remoting.invoke(addr, cmd, timeout_s)
        if resp.code not in ok:
            raise errors.error_for_response(resp, addr=addr, what=what)
        return resp

    async def heartbeat(self, addrs: Iterable[str] | None = None) -> list[str]:
        """HEART_BEAT (34) to every known broker (or `addrs`); returns the ones that failed."""
        body: bytes = encode_heartbeat(self._heartbeat_data())
        failed = []
        targets: list[str] = list(addrs if addrs is not None else self.routes.all_broker_addrs())
        results = await asyncio.gather(
            *[self.call(addr, RequestCode.HEART_BEAT, body=body, what="heartbeat") for addr in targets],
            return_exceptions=True)
        for addr, result in zip(targets, results):
            if isinstance(result, BaseException):
                if not isinstance(result, errors.TideMQError):
                    raise result
                log.warning("%s: heartbeat to %s failed: %s", self.client_id, addr, result)
                failed.append(addr)
        return failed

    async def unregister(self, producer_group: str | None = None,
                         consumer_group: str | None = None) -> None:
        ext = {"clientID": self.client_id}
        if producer_group:
            ext["producerGroup"] = producer_group
        if consumer_group:
            ext["consumerGroup"] = consumer_group
        for addr in self.routes.all_broker_addrs():
            try:
                await self.call(addr, RequestCode.UNREGISTER_CLIENT, ext, timeout_s=1.0,
                                what="unregister", ok=(ResponseCode.SUCCESS,))
            except errors.TideMQError as exc:
                log.info("%s: unregister at %s failed: %s", self.client_id, addr, exc)
