"""Admin HTTP (aiohttp) on its own port: read-only views of the node.

  GET /health   200 {"status":"ok",...} while the store accepts writes, else 503
  GET /metrics  Prometheus text from the node's own CollectorRegistry (node/ops/counters.py)
  GET /topics   topic configs with per-queue min/max offsets
  GET /config   the effective config, secrets redacted

Access (node/ops/admin_auth.py): anything but GET/HEAD needs the admin bearer token; GETs too
unless security.admin_read_open.
"""
from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from tidemq.node.config import BrokerConfig, redacted
from tidemq.node.ops.admin_auth import admin_auth_middleware
from tidemq.node.ops.counters import Metrics
from tidemq.node.replication.roles import Role
from tidemq.node.security.settings import admin_token
from tidemq.node.store.message_store import MessageStore
from tidemq.node.topics import TopicManager


@dataclass(frozen=True)
class AdminViews:
    """What the views read: the node's config, store, topic table, role and metrics."""
    cfg: BrokerConfig
    store: MessageStore
    topics: TopicManager
    role: Role
    metrics: Metrics
    addr: str   # the advertised remoting address


VIEWS_KEY: web.AppKey[AdminViews] = web.AppKey("views")


async def _health(request: web.Request) -> web.Response:
    v = request.app[VIEWS_KEY]
    writable = bool(v.store.writable)
    doc = {"status": "ok" if writable else "unavailable", "broker": v.cfg.broker_name,
           "addr": v.addr, "role": "master" if v.role.writable else "slave",
           "store_writable": writable}
    return web.json_response(doc, status=200 if writable else 503)


async def _metrics(request: web.Request) -> web.Response:
    body = await request.app[VIEWS_KEY].metrics.render_off_loop()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _topics(request: web.Request) -> web.Response:
    v = request.app[VIEWS_KEY]
    store = v.store
    out = []
    for name, tc in sorted(v.topics.table.items()):
        doc = tc.to_json()
        doc["queues"] = [{"queueId": q, "minOffset": store.min_queue_offset(name, q),
                          "maxOffset": store.max_queue_offset(name, q)}
                         for q in range(tc.queue_count)]
        out.append(doc)
    return web.json_response({"topics": out})


async def _config(request: web.Request) -> web.Response:
    return web.json_response(redacted(request.app[VIEWS_KEY].cfg))


class AdminHttp:
    """Serves the views while the store is open: the broker starts it after the store opens
    and stops it before the store closes."""

    def __init__(self, cfg: BrokerConfig, store: MessageStore, topics: TopicManager, role: Role,
                 metrics: Metrics, addr: str):
        self.app = web.Application(client_max_size=1024 * 1024, middlewares=[
            admin_auth_middleware(admin_token(cfg), cfg.security.admin_read_open)])
        self.app[VIEWS_KEY] = AdminViews(cfg, store, topics, role, metrics, addr)
        self.app.router.add_get("/health", _health)
        self.app.router.add_get("/metrics", _metrics)
        self.app.router.add_get("/topics", _topics)
        self.app.router.add_get("/config", _config)
        self.runner = web.AppRunner(self.app, access_log=None)

    async def start(self, host: str, port: int, ssl_context=None) -> int:
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, ssl_context=ssl_context)
        await site.start()
        return self.runner.addresses[0][1]

    async def stop(self) -> None:
        await self.runner.cleanup()
