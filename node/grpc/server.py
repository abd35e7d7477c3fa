"""The RocketMQ 5 gRPC messaging service (apache.rocketmq.v2.MessagingService) on a port beside
the remoting port, served by grpc.aio on the broker's own event loop.

Methods: QueryRoute, Heartbeat, Telemetry, NotifyClientTermination, QueryAssignment
(node/grpc/routing.py); SendMessage, EndTransaction (producer.py); ReceiveMessage,
AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue (consumer.py). Others
are answered UNIMPLEMENTED by grpcio.

Rules:
1. Every answer carries a Status; a handler's unexpected exception is logged and answered
   INTERNAL_ERROR with no exception text (the node keeps serving). Bytes that do not parse
   as the request are answered INVALID_ARGUMENT "malformed request".
2. Listens on listen_host only; TLS with the remoting certificate when security.tls_enable;
   ACL with the remoting ACL file's accounts when security.acl_enable (node/grpc/auth.py).
3. Requests that name a client (Telemetry, Heartbeat, receives) need the x-mq-client-id
   metadata the SDKs send; without it CLIENT_ID_REQUIRED.
4. Arrivals: the store dispatcher's arrival listener is chained so held receives wake at once
   when their queue grows (rule of node/grpc/consumer.py).
"""
from __future__ import annotations

import asyncio
import functools
import logging

import grpc
from google.protobuf.message import DecodeError

from tidemq.node.grpc import proto as pb
from tidemq.node.grpc.auth import GrpcAuth
from tidemq.node.grpc.common import reject_malformed, status
from tidemq.node.grpc.consumer import ConsumerService
from tidemq.node.grpc.deps import GrpcDeps
from tidemq.node.grpc.producer import ProducerService
from tidemq.node.grpc.routing import RoutingService

log = logging.getLogger("tidemq.grpc")
def _parser(message_cls):
    """A request deserializer that gives None for bytes that do not parse (rule 1): grpcio
    would otherwise answer with the decoder's exception text."""
    def parse(data: bytes):
        try:
            return message_cls.FromString(data)
        except DecodeError:
            return None
    return parse


def _guard_unary(fn, response_cls):
    @functools.wraps(fn)
    async def run(request, context):
        if request is None:
            await reject_malformed(context)
        try:
            return await fn(request, context)
        except Exception:
            log.exception("gRPC %s failed", fn.__name__)
            return response_cls(status=status(pb.Code.INTERNAL_ERROR, "internal error"))
    return run


def _credentials(cfg):
    """The remoting TLS certificate and key (rule 2), read once at start."""
    files = cfg.security.tls_files()
    with open(files.cert_file, "rb") as cert, open(files.key_file, "rb") as key:
        return grpc.ssl_server_credentials([(key.read(), cert.read())])


class GrpcServer:
    def __init__(self, deps: GrpcDeps):
        self.deps = deps
        self.port = 0
        self.server = None
        self.pop = deps.pop_state   # loaded at start, before the replicated state replays
        acl = deps.acl   # the remoting ACL's accounts (auth.py)
        self.auth = GrpcAuth(acl) if acl is not None else None
        self.routing = RoutingService(self)
        self.producer = ProducerService(self)
        self.consumer = ConsumerService(self)
        self._flush_task = None

    def deny(self, context, topic: str | None = None, group: str | None = None,
             perm: int = 0):
        """None when ACL is off or allows the request, else the refusal's Status."""
        if self.auth is None:
            return None
        refusal = self.auth.check(context, topic, group, perm)
        return None if refusal is None else status(*refusal)

    def _handlers(self) -> dict:
        unary = [("QueryRoute", self.routing.query_route, pb.QueryRouteRequest, pb.QueryRouteResponse),
                 ("Heartbeat", self.routing.heartbeat, pb.HeartbeatRequest, pb.HeartbeatResponse),
                 ("NotifyClientTermination", self.routing.notify_client_termination,
                  pb.NotifyClientTerminationRequest, pb.NotifyClientTerminationResponse),
                 ("QueryAssignment", self.routing.query_assignment, pb.QueryAssignmentRequest,
                  pb.QueryAssignmentResponse),
                 ("SendMessage", self.producer.send_message, pb.SendMessageRequest,
                  pb.SendMessageResponse),
                 ("EndTransaction", self.producer.end_transaction, pb.EndTransactionRequest,
                  pb.EndTransactionResponse),
                 ("AckMessage", self.consumer.ack_message, pb.AckMessageRequest, pb.AckMessageResponse),
                 ("ChangeInvisibleDuration", self.consumer.change_invisible_duration,
                  pb.ChangeInvisibleDurationRequest, pb.ChangeInvisibleDurationResponse),
                 ("ForwardMessageToDeadLetterQueue", self.consumer.forward_to_dlq,
                  pb.ForwardMessageToDeadLetterQueueRequest,
                  pb.ForwardMessageToDeadLetterQueueResponse)]
        out = {name: grpc.unary_unary_rpc_method_handler(
            _guard_unary(fn, resp), request_deserializer=_parser(req),
            response_serializer=resp.SerializeToString) for name, fn, req, resp in unary}
        out["ReceiveMessage"] = grpc.unary_stream_rpc_method_handler(
            self.consumer.receive_message, request_deserializer=_parser(pb.ReceiveMessageRequest),
            response_serializer=pb.ReceiveMessageResponse.SerializeToString)
        out["Telemetry"] = grpc.stream_stream_rpc_method_handler(
            self.routing.telemetry, request_deserializer=_parser(pb.TelemetryCommand),
            response_serializer=pb.TelemetryCommand.SerializeToString)
        return out

    async def start(self) -> int:
        cfg = self.deps.cfg
        # long-lived calls (held receives, one Telemetry stream per client) are bounded like
        # held pulls and connections; past it grpcio answers RESOURCE_EXHAUSTED
        self.server = grpc.aio.server(
            maximum_concurrent_rpcs=cfg.max_held_pulls + cfg.max_connections, options=[
            ("grpc.max_receive_message_length", cfg.max_frame_bytes),
            ("grpc.max_send_message_length", cfg.max_frame_bytes)])
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(pb.SERVICE, self._handlers()),))
        address = f"{cfg.listen_host}:{max(cfg.grpc_port, 0)}"
        if ":" in cfg.listen_host:
            address = f"[{cfg.listen_host}]:{max(cfg.grpc_port, 0)}"
        if cfg.security.tls_enable:
            self.port = self.server.add_secure_port(address, _credentials(cfg))
        else:
            self.port = self.server.add_insecure_port(address)
        await self.server.start()
        dispatcher = self.deps.store.dispatcher
        chained = dispatcher.arrival_listener
        bridge = self.deps.bridge

        def on_arrival(arrived):  # rule 4
            if chained is not None:
                chained(arrived)
            if self.consumer.waiting:
                bridge.post_or_run(self.consumer.on_arrival, dict(arrived))
        dispatcher.arrival_listener = on_arrival
        self._flush_task = asyncio.get_running_loop().create_task(self._flush_loop())
        return self.port

    async def _flush_loop(self) -> None:
        interval = self.deps.cfg.offsets_flush_interval_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            if self.pop.dirty:
                data = self.pop.dump(self._state_offset())
                try:
                    await loop.run_in_executor(None, self.pop.write, data)
                except OSError:
                    log.exception("could not persist the gRPC receipt state; will retry")
                    self.pop.dirty = True

    def _state_offset(self) -> int | None:
        """Under HA: the replicated-state records the receipt state includes up to."""
        return self.deps.offsets.state_offset if self.deps.replicated_state else None

    async def stop(self) -> None:
        if self._flush_task is not None:
            self._flush_task.cancel()
        if self.server is not None:
            self.consumer.close()
            self.routing.close()
            await self.server.stop(grace=0.5)
            self.server = None
        try:
            self.pop.write(self.pop.dump(self._state_offset()))
        except OSError:
            log.exception("could not persist the gRPC receipt state at shutdown")
