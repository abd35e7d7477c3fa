"""Drives the official RocketMQ 5 Python SDK (rocketmq-python-client) for the gRPC tests.

Runs under the SDK's own interpreter (scripts/setup.sh creates .venv-rmq5: the SDK's top-level
`rocketmq` package cannot share a virtualenv with the RocketMQ 4 client the other tests use).
Reads one JSON command per stdin line and answers one JSON line each:

    {"op": "producer", "topics": [..], "check": "commit"|"rollback"|"unknown"|null}
    {"op": "send", "topic", "body", "tag"?, "keys"?, "props"?, "group"?, "deliver_ms"?}
    {"op": "send_tx", "topic", "body", "end": "commit"|"rollback"|"none"}
    {"op": "checks"}                         transaction checks the checker answered
    {"op": "simple", "group", "topic", "sql"?, "tag"?, "await_s"?}
    {"op": "receive", "max", "invisible_s"}  -> messages, each with a token for ack/change
    {"op": "ack", "token"}  {"op": "change", "token", "invisible_s"}
    {"op": "push", "group", "topic", "fail"?: [bodies to fail], "sql"?}
    {"op": "consumed"}                       what the push listener saw, in order
    {"op": "shutdown"}

Errors answer {"ok": false, "error": <class>, "message": <text>, "code": <status code>}.
Environment: RMQ5_AK / RMQ5_SK sign requests (ACL); RMQ5_TLS=1 connects with TLS (trusting
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, grpcio's own variable).
"""
import json
import os
import sys
import threading

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
)
from rocketmq.grpc_protocol import FilterType, TransactionResolution

RESOLUTIONS = {"commit": TransactionResolution.COMMIT, "rollback": TransactionResolution.ROLLBACK,
               "unknown": TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED}


class Checker(TransactionChecker):
    def __init__(self, answer):
        self.answer = answer
        self.seen = []

    def check(self, message):
        self.seen.append(message.body.decode())
        return RESOLUTIONS[self.answer]


class Listener(MessageListener):
    def __init__(self, fail):
        self.fail = set(fail)
        self.seen = []
        self.lock = threading.Lock()

    def consume(self, message):
        body = message.body.decode()
        with self.lock:
            self.seen.append([body, message.delivery_attempt, message.message_group])
        return ConsumeResult.FAILURE if body in self.fail else ConsumeResult.SUCCESS


def describe(m, token):
    return {"token": token, "body": m.body.decode(), "tag": m.tag, "props": dict(m.properties),
            "attempt": m.delivery_attempt, "message_id": m.message_id, "group": m.message_group,
            "keys": sorted(m.keys) if m.keys else []}


class Session:
    def __init__(self, endpoint):
        credentials = Credentials(os.environ.get("RMQ5_AK", ""), os.environ.get("RMQ5_SK", ""))
        self.config = ClientConfiguration(endpoint, credentials, request_timeout=5)
        self.tls = os.environ.get("RMQ5_TLS") == "1"
        self.producer = self.simple = self.push = self.checker = self.listener = None
        self.received = {}
        self.next_token = 0

    def op_producer(self, cmd):
        self.checker = Checker(cmd["check"]) if cmd.get("check") else None
        self.producer = Producer(self.config, tuple(cmd["topics"]), self.checker, self.tls)
        self.producer.startup()
        return {}

    def _message(self, cmd):
        m = Message()
        m.topic = cmd["topic"]
        m.body = cmd["body"].encode()
        if cmd.get("tag"):
            m.tag = cmd["tag"]
        if cmd.get("keys"):
            m.keys = cmd["keys"]
        for k, v in (cmd.get("props") or {}).items():
            m.add_property(k, v)
        if cmd.get("group"):
            m.message_group = cmd["group"]
        if cmd.get("deliver_ms"):
            m.delivery_timestamp = cmd["deliver_ms"] // 1000
        return m

    def op_send(self, cmd):
        r = self.producer.send(self._message(cmd))
        return {"message_id": r.message_id, "offset": r.offset}

    def op_send_tx(self, cmd):
        tx = self.producer.begin_transaction()
        r = self.producer.send(self._message(cmd), tx)
        if cmd["end"] == "commit":
            tx.commit()
        elif cmd["end"] == "rollback":
            tx.rollback()
        return {"message_id": r.message_id, "transaction_id": r.transaction_id}

    def op_checks(self, cmd):
        return {"checks": list(self.checker.seen)}

    def _filter(self, cmd):
        if cmd.get("sql"):
            return FilterExpression(cmd["sql"], FilterType.SQL)
        return FilterExpression(cmd.get("tag") or "*")

    def op_simple(self, cmd):
        self.simple = SimpleConsumer(self.config, cmd["group"], {cmd["topic"]: self._filter(cmd)},
                                     await_duration=cmd.get("await_s", 2), tls_enable=self.tls)
        self.simple.startup()
        return {}

    def op_receive(self, cmd):
        out = []
        for m in self.simple.receive(cmd["max"], cmd["invisible_s"]):
            self.next_token += 1
            self.received[self.next_token] = m
            out.append(describe(m, self.next_token))
        return {"messages": out}

    def op_ack(self, cmd):
        self.simple.ack(self.received[cmd["token"]])
        return {}

    def op_change(self, cmd):
        self.simple.change_invisible_duration(self.received[cmd["token"]], cmd["invisible_s"])
        return {}

    def op_push(self, cmd):
        self.listener = Listener(cmd.get("fail", ()))
        self.push = PushConsumer(self.config, cmd["group"], self.listener,
                                 {cmd["topic"]: self._filter(cmd)}, tls_enable=self.tls)
        self.push.startup()
        return {}

    def op_consumed(self, cmd):
        with self.listener.lock:
            return {"consumed": list(self.listener.seen)}

    def op_shutdown(self, cmd):
        for client in (self.push, self.simple, self.producer):
            if client is not None:
                client.shutdown()
        return {}


def main():
    session = Session(sys.argv[1])
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            reply = {"ok": True, **getattr(session, "op_" + cmd["op"])(cmd)}
        except Exception as exc:  # reported to the test, which asserts on it
            code = getattr(exc, "code", None)
            if callable(code):  # a grpc.RpcError (e.g. an endpoint that went away)
                code = str(code())
            reply = {"ok": False, "error": type(exc).__name__, "message": str(exc),
                     "code": code}
        print(json.dumps(reply), flush=True)
        if cmd["op"] == "shutdown":
            break


if __name__ == "__main__":
    main()
