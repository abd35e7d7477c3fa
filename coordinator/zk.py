"""ZkSession: a kazoo client bridged to asyncio. The only module that talks to kazoo directly.

kazoo runs its own thread and has no asyncio handler. Here:
- `*_async` calls return an IAsyncResult; `_await` links it to a loop future with
  call_soon_threadsafe, so the loop never blocks on ZooKeeper.
- Watches and the state listener run on kazoo's thread and only hop onto the loop.
- start/stop block, so they run in a worker thread.

Settings from measurement (docs/replication.md, Kazoo settings): a bounded reconnect backoff
(max_delay 1 s; kazoo's default grows to 3600 s and let sessions expire after the server came
back), the session timeout from config, and the same session kept across a reconnect to
another ensemble node.
TLS and digest ACLs come from coordinator/zk_security.py (kazoo's default_acl covers every
create, transactions and parents included).

States reported to listeners (on the loop): "CONNECTED", "SUSPENDED", "LOST" (kazoo's
KazooState names). Rule: SUSPENDED = stop acting on leadership now; LOST = the session and its
ephemeral nodes are gone, contend again once CONNECTED (kazoo opens a new session by itself).
"""
from __future__ import annotations

import asyncio
import logging

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from kazoo.retry import KazooRetry

from .zk_security import ZkSecurity

log = logging.getLogger("tidemq.coordinator.zk")

# Errors that mean "ZooKeeper cannot be reached right now" (retry later, change nothing).
UNREACHABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError)
__all__ = ["ZkSession", "stop_task", "UNREACHABLE", "BadVersionError", "NodeExistsError", "NoNodeError",
           "NotEmptyError", "NoAuthError", "ZkSecurity"]


async def stop_task(task: asyncio.Task) -> None:
    """Cancel `task` and wait for it. The cancel is repeated: CPython 3.11's wait_for can swallow
    one that lands as its inner future completes (gh-86296); owners also end their loops on a
    stopping flag."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.1)
    if not task.cancelled() and task.exception() is not None:
        log.debug("stopped task ended with %r", task.exception())


class ZkSession:
    def __init__(self, hosts: str, session_timeout_s: float, *, auth: str = "",
                 reconnect_max_delay_s: float = 1.0, security: ZkSecurity | None = None):
        """security: TLS and digest ACLs (coordinator/zk_security.py); `auth` alone is the
        same as ZkSecurity(auth=auth)."""
        self.hosts = hosts
        self.session_timeout_s = session_timeout_s
        if security is None:
            security = ZkSecurity(auth=auth)
        self.security = security
        self.client = KazooClient(
            hosts=hosts, timeout=session_timeout_s,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2,
                                        max_delay=reconnect_max_delay_s),
            command_retry=KazooRetry(max_tries=3, delay=0.1, max_delay=reconnect_max_delay_s),
            **security.kazoo_kwargs())
        self._listeners: list = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.state = "LOST"
        self.client.add_listener(self._on_state)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self, timeout_s: float = 15.0) -> None:
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.client.start, timeout_s)
        self.state = "CONNECTED"

    async def stop(self) -> None:
        """Close the session: its ephemeral nodes go at once (a clean hand-over)."""
        try:
            await asyncio.to_thread(self.client.stop)
            await asyncio.to_thread(self.client.close)
        except Exception:   # stopping must not fail the caller's shutdown
            log.exception("closing the ZooKeeper client failed")

    @property
    def session_id(self) -> int | None:
        cid = self.client.client_id
        return cid[0] if cid else None

    def add_listener(self, fn) -> None:
        """fn(state) called on the loop for every state change."""
        self._listeners.append(fn)

    def _on_state(self, state) -> None:   # kazoo's thread: never block here
        name = str(state)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._deliver, name)

    def _deliver(self, name: str) -> None:
        self.state = name
        for fn in list(self._listeners):
            try:
                fn(name)
            except Exception:
                log.exception("ZooKeeper state listener failed")

    def loop_watch(self, fn):
        """A kazoo watch function that calls fn(event) on the loop."""
        def watch(event):
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(fn, event)
        return watch

    # -- operations ----------------------------------------------------------------------
    def _await(self, ar) -> asyncio.Future:
        loop = self._loop
        fut = loop.create_future()

        def settle():
            if fut.done():
                return
            try:
                fut.set_result(ar.get_nowait())
            except Exception as exc:
                fut.set_exception(exc)

        ar.rawlink(lambda _ar: loop.call_soon_threadsafe(settle))
        return fut

    async def get(self, path: str, watch=None):
        return await self._await(self.client.get_async(path, watch=watch))

    async def get_or_none(self, path: str, watch=None):
        """(data, stat), or (None, None) when the node does not exist (the watch then fires
        when it is created)."""
        try:
            return await self.get(path, watch)
        except NoNodeError:
            if watch is not None:
                await self.exists(path, watch)
            return None, None

    async def get_acls(self, path: str):
        return await self._await(self.client.get_acls_async(path))

    async def tighten_acls(self, paths) -> list[str]:
        """Give existing znodes among `paths` this session's ACL (zk_security.py rule 2) when
        they carry another one: nodes made before credentials were configured. Returns the
        paths changed; a node whose ACL this identity may not change is left (and logged)."""
        wanted = self.security.acl()
        changed = []
        if wanted is None:
            return changed
        for path in paths:
            try:
                acl, stat = await self.get_acls(path)
                if set(acl) == set(wanted):
                    continue
                await self._await(self.client.set_acls_async(path, wanted, stat.aversion))
                changed.append(path)
            except NoNodeError:
                continue
            except (NoAuthError, BadVersionError) as exc:
                log.warning("ACL of %s left as it is: %s", path, exc.__class__.__name__)
        if changed:
            log.info("digest ACL set on %d existing znodes", len(changed))
        return changed

    async def exists(self, path: str, watch=None):
        return await self._await(self.client.exists_async(path, watch=watch))

    async def children(self, path: str, watch=None) -> list[str]:
        try:
            return await self._await(self.client.get_children_async(path, watch=watch))
        except NoNodeError:
            return []

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
                     makepath: bool = False) -> str:
        return await self._await(self.client.create_async(path, data, ephemeral=ephemeral,
                                                          makepath=makepath))

    async def ensure_path(self, path: str) -> None:
        try:
            await self.create(path, b"", makepath=True)
        except NodeExistsError:
            pass

    async def set(self, path: str, data: bytes, version: int = -1):
        return await self._await(self.client.set_async(path, data, version))

    async def delete(self, path: str, version: int = -1) -> None:
        await self._await(self.client.delete_async(path, version))

    async def commit(self, build) -> list:
        """Run a transaction: build(tx) adds operations. Returns kazoo's per-operation
        results (an exception instance in place of each failed operation)."""
        tx = self.client.transaction()
        build(tx)
        return await self._await(tx.commit_async())

    # -- blocking calls for code that runs outside the loop (a worker thread) -------------
    def blocking(self):
        return self.client
