"""Where a consumer group's progress lives: on the broker (clustering) or in a local file
(broadcasting; client/consumer/broadcast_progress.py adds the broker's per-member copy on top).

An offset is the next queue offset to consume. -1 means "none stored".

Rules:
1. `update` only records locally; `persist` sends what changed since the last persist, so an
   idle consumer costs no requests. Offsets never move backwards through `update` unless
   `allow_backwards` (a reset).
2. The local file is replaced atomically (write to a temp file, fsync, rename), so a crash
   leaves the old or the new table, never a torn one.
3. Local file: `<dir>/<client id>/<group>.json` = {"offsetTable": {"topic@broker@queue": n}}.
4. The remote store commits a broker's changed offsets in UPDATE_CONSUMER_OFFSET_BATCH (9003)
   requests of at most OFFSET_BATCH_QUEUES queues; a broker that answers 3
   REQUEST_CODE_NOT_SUPPORTED (an older TideMQ, a RocketMQ broker) is remembered and gets one
   UPDATE_CONSUMER_OFFSET (15) per queue from then on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import tempfile
from collections.abc import Collection
from typing import TYPE_CHECKING

from tidemq import errors
from tidemq.consumer import broker_calls as pull_api

if TYPE_CHECKING:
    from tidemq.instance import ClientInstance
    from tidemq.topic_routes import MessageQueue

log = logging.getLogger(__name__)


class _Table:
    def __init__(self) -> None:
        self.offsets: dict[MessageQueue, int] = {}
        self.persisted: dict[MessageQueue, int] = {}  # the last persisted offsets

    def update(self, mq: MessageQueue, offset: int, allow_backwards: bool = False) -> None:
        old = self.offsets.get(mq, -1)
        if allow_backwards or offset > old:
            self.offsets[mq] = offset

    def get(self, mq: MessageQueue) -> int:
        return self.offsets.get(mq, -1)

    def remove(self, mq: MessageQueue) -> None:
        self.offsets.pop(mq, None)
        self.persisted.pop(mq, None)

    def dirty(self, mqs: Collection[MessageQueue] | None = None) -> dict[MessageQueue, int]:
        keys = self.offsets if mqs is None else [m for m in mqs if m in self.offsets]
        return {mq: self.offsets[mq] for mq in keys if self.persisted.get(mq) != self.offsets[mq]}


class _TableStore:
    """What both offset stores share: the in-memory table of consumed offsets."""

    def __init__(self) -> None:
        self._table = _Table()

    def update(self, mq: MessageQueue, offset: int, allow_backwards: bool = False) -> None:
        self._table.update(mq, offset, allow_backwards)

    def get(self, mq: MessageQueue) -> int:
        return self._table.get(mq)


class RemoteOffsetStore(_TableStore):
    """Clustering: offsets kept by the broker (14 query, 15 commit)."""

    def __init__(self, instance: ClientInstance, group: str) -> None:
        self._instance = instance
        self._group = group
        self._no_batch: set[str] = set()  # brokers that answered 9003 with 3 (rule 4)
        super().__init__()

    def _addr(self, mq: MessageQueue) -> str:
        addr: str | None = self._instance.routes.read_addr(mq.broker_name)
        if addr is None:
            raise errors.NoRouteError(f"no address for broker {mq.broker_name!r}")
        return addr

    async def read(self, mq: MessageQueue) -> int:
        offset = await pull_api.query_consumer_offset(self._instance, self._addr(mq), self._group, mq)
        return self.known(mq, offset)

    def known(self, mq: MessageQueue, offset: int) -> int:
        """What read() does with an offset the broker reported another way (208)."""
        if offset >= 0:
            self._table.update(mq, offset, allow_backwards=True)
            self._table.persisted[mq] = offset
        return offset

    async def persist(self, mqs: Collection[MessageQueue] | None = None) -> int:
        """Commit changed offsets (rule 4); returns the number committed. Failures are logged
        and kept dirty for the next round."""
        by_addr: dict[str, list[tuple[MessageQueue, int]]] = {}
        for mq, off in self._table.dirty(mqs).items():
            try:
                by_addr.setdefault(self._addr(mq), []).append((mq, off))
            except errors.NoRouteError as exc:
                log.warning("commit of %s=%d failed: %s", mq, off, exc)
        done = await asyncio.gather(*[self._commit_to(addr, rows)
                                      for addr, rows in by_addr.items()])
        return sum(done)

    async def _commit_to(self, addr: str, rows: list[tuple[MessageQueue, int]]) -> int:
        """Commit one broker's rows, in batches while it serves them; the number committed."""
        done, step = 0, pull_api.OFFSET_BATCH_QUEUES
        for at in range(0, len(rows), step):
            if addr in self._no_batch:
                return done + await self._commit_each(addr, rows[at:])
            chunk = rows[at:at + step]
            try:
                await pull_api.update_consumer_offsets(
                    self._instance, addr, self._group,
                    [(mq.topic, mq.queue_id, off) for mq, off in chunk])
            except errors.RequestCodeNotSupported:
                self._no_batch.add(addr)
                log.info("%s commits no offset batches: one request per queue", addr)
                return done + await self._commit_each(addr, rows[at:])
            except errors.TideMQError as exc:
                log.warning("commit of %d offsets to %s failed: %s", len(chunk), addr, exc)
                continue
            for mq, off in chunk:
                self._table.persisted[mq] = off
            done += len(chunk)
        return done

    async def _commit_each(self, addr: str, rows: list[tuple[MessageQueue, int]]) -> int:
        results = await asyncio.gather(
            *[pull_api.update_consumer_offset(self._instance, addr, self._group, mq, off)
              for mq, off in rows], return_exceptions=True)
        done = 0
        for (mq, off), res in zip(rows, results):
            if isinstance(res, BaseException):
                if not isinstance(res, errors.TideMQError):
                    raise res
                log.warning("commit of %s=%d failed: %s", mq, off, res)
            else:
                self._table.persisted[mq] = off
                done += 1
        return done

    def remove(self, mq: MessageQueue) -> None:
        self._table.remove(mq)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@#%-]", "_", name)


class LocalFileOffsetStore(_TableStore):
    """Broadcasting: offsets in a local JSON file (rule 3)."""

    def __init__(self, directory: str, client_id: str, group: str) -> None:
        base = os.path.expanduser(directory)
        self.path = os.path.join(base, _safe(client_id), f"{_safe(group)}.json")
        super().__init__()
        self._loaded = self._load()

    def _load(self) -> dict[str, int]:
        try:
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
            return {k: int(v) for k, v in (doc.get("offsetTable") or {}).items()}
        except FileNotFoundError:
            return {}
        except (ValueError, OSError, AttributeError) as exc:
            log.warning("ignoring unreadable offset file %s: %s", self.path, exc)
            return {}

    async def read(self, mq: MessageQueue) -> int:
        offset = self._loaded.get(mq.key(), -1)
        if offset >= 0:
            self._table.update(mq, offset, allow_backwards=True)
        return offset

    async def persist(self, mqs: Collection[MessageQueue] | None = None) -> int:
        dirty = self._table.dirty()
        if not dirty:
            return 0
        for mq, off in self._table.offsets.items():
            self._loaded[mq.key()] = off
        self._write({"offsetTable": dict(sorted(self._loaded.items()))})
        self._table.persisted.update(dirty)
        return len(dirty)

    def _write(self, doc: dict[str, object]) -> None:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".offsets-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def remove(self, mq: MessageQueue) -> None:
        self._table.remove(mq)
