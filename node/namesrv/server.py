"""`tidemq namesrv`: a name server that serves the ZooKeeper view of one cluster.

    tidemq namesrv --zk 127.0.0.1:2181 --cluster DefaultCluster --listen 127.0.0.1:9876 \
                   --http 127.0.0.1:9877

Run several: they hold no state of their own (coordinator/view.py reads ZooKeeper). Answers
GET_ROUTEINFO_BY_TOPIC (105), GET_BROKER_CLUSTER_INFO (106) and the cluster-wide listings
RocketMQ's admin tools read (206, 224, 304, ...: node/namesrv/lists.py) over the RocketMQ
remoting protocol, and an HTTP JSON view:

    GET /health          {"status": "ok", "zookeeper": "CONNECTED", "groups": n}
    GET /cluster         every group: epoch, master, in-sync set, members, topics, addresses
    GET /route/<topic>   the route 105 would answer, as JSON (404 if none)
    GET /metrics         Prometheus: each group's master presence, epoch, in-sync size, the
                         ZooKeeper session, request counters (node/ops/metric_catalog.py)

Prints `TIDEMQ_NAMESRV_READY remoting=<host:port> http=<host:port>` once both listen.
"""
from __future__ import annotations

import argparse
import asyncio
import errno
import json
import logging
import os
import signal
import socket
import sys

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from tidemq.coordinator.layout import ClusterPaths
from tidemq.coordinator.view import ClusterView
from tidemq.coordinator.zk import NoAuthError, ZkSession
from tidemq.coordinator.zk_security import ZkSecurity, ZkSecurityError, add_cli_options, from_cli
from tidemq.node.config import BrokerConfig
from tidemq.node.namesrv.lists import NameServerLists
from tidemq.node.ops.admin_auth import admin_auth_middleware
from tidemq.node.ops.counters import Metrics
from tidemq.node.ops.scrape import NameServerCollector
from tidemq.node.processors.common import FAQ_SUFFIX, error, ok
from tidemq.node.remoting.server import RemotingServer
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.route_json import encode_topic_route
from tidemq.tls import TlsFiles

log = logging.getLogger("tidemq.namesrv")
READY_PREFIX = "TIDEMQ_NAMESRV_READY"


class NameServer:
    def __init__(self, zk_hosts: str, cluster: str, *, listen=("127.0.0.1", 9876),
                 http=("127.0.0.1", 9877), session_timeout_ms: int = 6000,
                 zk_root: str = "/tidemq", tls=None, admin_token: str = "",
                 zk_security: ZkSecurity | None = None):
        self.tls = tls  # client.tls.TlsFiles: TLS on both ports, None = plaintext
        self.admin_token = admin_token
        # TLS to ZooKeeper and the credential, when reads need one (coordinator/zk_security.py)
        self.session = ZkSession(zk_hosts, session_timeout_ms / 1000, security=zk_security)
        self.view = ClusterView(self.session, ClusterPaths(cluster, zk_root))
        self.listen, self.http = listen, http
        self.remoting_port = self.http_port = 0
        self._server = self._runner = None

    async def start(self) -> None:
        await self.session.start()
        await self.view.start()
        loop = asyncio.get_running_loop()
        self.metrics = Metrics()
        self.metrics.add_collector(NameServerCollector(self))   # node/ops/metric_catalog.py
        self._server = RemotingServer(BrokerConfig(), loop, self.metrics)
        self._server.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self._route)
        self._server.register(RequestCode.GET_BROKER_CLUSTER_INFO, self._cluster_info)
        NameServerLists(self.view).register(self._server)
        sock = socket.create_server(self.listen, backlog=1024)
        ssl_ctx = self.tls.server() if self.tls is not None else None
        self.remoting_port = await self._server.start_on(sock, ssl_ctx, 10.0)
        # Reads stay open; anything that would change state needs the admin token
        # (docs/security.md, Admin HTTP).
        app = web.Application(client_max_size=1024 * 1024,
                              middlewares=[admin_auth_middleware(self.admin_token, True)])
        app.router.add_get("/health", self._http_health)
        app.router.add_get("/cluster", self._http_cluster)
        app.router.add_get("/metrics", self._http_metrics)
        app.router.add_get("/route/{topic}", self._http_route)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.http[0], self.http[1], ssl_context=ssl_ctx)
        await site.start()
        self.http_port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._server is not None:
            await self._server.stop()
        await self.view.stop()
        await self.session.stop()

    # -- remoting ------------------------------------------------------------------------
    def _route(self, conn, cmd):
        topic = cmd.require_str("topic")
        route = self.view.route(topic)
        if route is None:
            return error(cmd, ResponseCode.TOPIC_NOT_EXIST,
                         f"No topic route info in name server for the topic: {topic}{FAQ_SUFFIX}")
        return ok(cmd, body=encode_topic_route(route))

    def _cluster_info(self, conn, cmd):
        return ok(cmd, body=json.dumps(self.view.cluster_info(), sort_keys=True).encode())

    # -- HTTP ----------------------------------------------------------------------------
    async def _http_health(self, request):
        return web.json_response({"status": "ok", "zookeeper": self.session.state,
                                  "groups": len(self.view.snapshot)})

    async def _http_metrics(self, request):
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _http_cluster(self, request):
        return web.json_response(self.view.to_json())

    async def _http_route(self, request):
        route = self.view.route(request.match_info["topic"])
        if route is None:
            return web.json_response({"error": "no route"}, status=404)
        return web.Response(body=encode_topic_route(route), content_type="application/json")


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def run_namesrv(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tidemq namesrv",
                                description="Serve routes of a ZooKeeper-coordinated cluster.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--zk", required=True, help="ZooKeeper connect string")
    p.add_argument("--cluster", default="DefaultCluster",
                   help="cluster name (the brokers' cluster_name)")
    p.add_argument("--listen", default="127.0.0.1:9876", help="remoting host:port (0 = any)")
    p.add_argument("--http", default="127.0.0.1:9877", help="HTTP JSON view host:port")
    p.add_argument("--session-timeout-ms", type=int, default=6000,
                   help="ZooKeeper session timeout")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    p.add_argument("--tls-cert", default="", help="PEM certificate: TLS on both ports")
    p.add_argument("--tls-key", default="", help="PEM key of --tls-cert")
    p.add_argument("--tls-ca", default="", help="CA that verifies client certificates")
    p.add_argument("--tls-require-client-cert", action="store_true", help="mutual TLS")
    add_cli_options(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    try:
        tls = None
        if args.tls_cert or args.tls_key:
            tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_ca, args.tls_require_client_cert)
            tls.server()  # a bad file fails here, with exit 2
        ns = NameServer(args.zk, args.cluster, listen=_addr(args.listen), http=_addr(args.http),
                        session_timeout_ms=args.session_timeout_ms, tls=tls,
                        admin_token=os.environ.get("TIDEMQ_ADMIN_TOKEN", ""),
                        zk_security=from_cli(args))
    except (ValueError, ZkSecurityError) as exc:
        print(f"tidemq namesrv: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(ns))


async def _serve(ns: NameServer) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await ns.start()
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            log.exception("name server failed to start")
        else:   # a common mistake: one line with a hint, not a traceback
            print(f"tidemq namesrv: a port is already in use ({exc.strerror}; remoting "
                  f"{ns.listen[1]}, http {ns.http[1]}) (hint: another name server runs here; "
                  f"pick free ports with --listen and --http)", file=sys.stderr, flush=True)
        await ns.stop()
        return 1
    except NoAuthError:
        log.error("ZooKeeper refused this name server's reads (NoAuth): the cluster's znodes "
                  "are not world-readable (zookeeper.acl_world_read=false); give the name server "
                  "the credentials with --zk-auth-file or $TIDEMQ_ZK_AUTH")
        await ns.stop()
        return 1
    except Exception:
        log.exception("name server failed to start")
        await ns.stop()
        return 1
    print(f"{READY_PREFIX} remoting={ns.listen[0]}:{ns.remoting_port} "
          f"http={ns.http[0]}:{ns.http_port}", flush=True)
    await stop.wait()
    await ns.stop()
    return 0


if __name__ == "__main__":
    sys.exit(run_namesrv(sys.argv[1:]))
