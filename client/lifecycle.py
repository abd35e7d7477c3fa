"""AsyncLifecycle: what every SDK client object shares: `async with` support and client_id.

Subclasses implement start() and shutdown() and keep their ClientInstance in `_instance`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from tidemq.instance import ClientInstance


class AsyncLifecycle:
    _instance: ClientInstance | None = None

    @property
    def client_id(self) -> str | None:
        return self._instance.client_id if self._instance else None

    async def start(self) -> Self:
        """Connect and begin; returns the client itself."""
        raise NotImplementedError

    async def shutdown(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()
