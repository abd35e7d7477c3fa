"""The replica control the coordinator drives, and its adapter over ha.service.HAService.

The coordinator never imports the broker (STYLE: dependencies point one way); the broker hands
it something with this shape. HAReplica adapts HAService (ha/service.py) to it.
"""
from __future__ import annotations

from typing import Protocol


class Replica(Protocol):
    async def become_master(self, epoch: int) -> str:
        """Lead `epoch` (cut only a partial record; keep every complete one) and return the
        HA listen address "host:port" followers connect to."""

    async def follow(self, ha_addr: tuple[str, int], epoch: int) -> None: ...

    def fence(self) -> None:
        """Stop accepting writes now (ZooKeeper SUSPENDED); waiters get 'not confirmed'."""

    async def step_down(self) -> None:
        """Give up any role (the session was lost, or another node leads)."""

    def progress(self) -> dict:
        """role, epoch, last_epoch, max_offset, acked_offset, confirmed_offset."""

    def watch_master_link(self, fn) -> None:
        """fn() whenever a slave's link to its master ends (fast failover's signal)."""


class HAReplica:
    def __init__(self, ha, store):
        self.ha = ha
        self.store = store

    async def become_master(self, epoch: int) -> str:
        await self.ha.become_master(epoch)
        return f"{self.ha.config.listen_host}:{self.ha.listen_port}"

    async def follow(self, ha_addr: tuple[str, int], epoch: int) -> None:
        await self.ha.follow(ha_addr, epoch)

    def fence(self) -> None:
        self.ha.fence()

    def watch_master_link(self, fn) -> None:
        self.ha.on_link_lost = fn

    async def step_down(self) -> None:
        await self.ha.stop()

    def progress(self) -> dict:
        ha, store = self.ha, self.store
        return {"role": ha.role, "epoch": ha.epoch, "last_epoch": ha.last_epoch,
                "max_offset": store.max_offset, "acked_offset": ha.acked_offset,
                "confirmed_offset": store.confirmed_offset}
