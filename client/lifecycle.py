"""AsyncLifecycle: what every SDK client object shares: `async with` support and client_id.

Subclasses implement start() and shutdown() and keep their ClientInstance in `_instance`.
"""
from __future__ import annotations


class AsyncLifecycle:
    _instance = None

    @property
    def client_id(self):
        return self._instance.client_id if self._instance else None

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc_info):
        await self.shutdown()
