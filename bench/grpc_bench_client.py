"""The gRPC half of bench/grpc_bench.py, run under the RocketMQ 5 SDK's own interpreter
(.venv-rmq5: the SDK's top-level `rocketmq` package cannot share a virtualenv with the RocketMQ 4
client). Prints one JSON line.

    .venv-rmq5/bin/python bench/grpc_bench_client.py <host:port> <topic> <seconds> <body bytes>

Phases: sync send (one at a time: msgs/s, p50/p99 ms); async send (64 in flight: msgs/s);
SimpleConsumer receive(32) + ack of everything sent (msgs/s, p99 ms of a receive call,
duplicates seen).
"""
import json
import os
import sys
import time
from concurrent.futures import wait

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

IN_FLIGHT = 64


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))] if values else 0


def message(topic, body):
    m = Message()
    m.topic = topic
    m.body = body
    return m


def sync_send(producer, topic, body, seconds):
    lat, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        producer.send(message(topic, body))
        lat.append((time.perf_counter() - t0) * 1000)
    return len(lat) / seconds, pct(lat, 50), pct(lat, 99), len(lat)


def async_send(producer, topic, body, seconds):
    sent, failed, pending = 0, 0, set()
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end or pending:
        while time.perf_counter() < end and len(pending) < IN_FLIGHT:
            pending.add(producer.send_async(message(topic, body)))
        done, pending = wait(pending, timeout=10, return_when="FIRST_COMPLETED")
        for f in done:
            if f.exception() is None:
                sent += 1
            else:
                failed += 1
    return sent / (time.perf_counter() - t0), sent, failed


def receive_all(consumer, total, timeout_s):
    got, lat, ids = 0, [], set()
    t0 = time.perf_counter()
    end = t0 + timeout_s
    while got < total and time.perf_counter() < end:
        r0 = time.perf_counter()
        msgs = consumer.receive(32, 60)
        lat.append((time.perf_counter() - r0) * 1000)
        for m in msgs:  # the SDK's ack_async returns no future: one sync ack per message
            consumer.ack(m)
            ids.add(m.message_id)
        got += len(msgs)
    return got / (time.perf_counter() - t0), got, pct(lat, 99), got - len(ids)


def main():
    endpoint, topic, seconds, body_bytes = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    body = os.urandom(body_bytes // 2).hex().encode()[:body_bytes]
    config = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
    producer = Producer(config, (topic,))
    producer.startup()
    out = {}
    n_warm = sync_send(producer, topic, body, 0.5)[3]  # warm-up: channel, route
    rate, p50, p99, n_sync = sync_send(producer, topic, body, seconds)
    out.update(grpc_sync_send_msgs_s=round(rate), grpc_sync_send_p50_ms=round(p50, 3),
               grpc_sync_send_p99_ms=round(p99, 3))
    rate, n_async, failed = async_send(producer, topic, body, seconds)
    out.update(grpc_async_send_msgs_s=round(rate), grpc_async_send_failed=failed)
    producer.shutdown()
    consumer = SimpleConsumer(config, "grpc-bench", {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    total = n_warm + n_sync + n_async
    rate, got, p99, dups = receive_all(consumer, total, max(60.0, seconds * 10))
    out.update(grpc_receive_msgs_s=round(rate), grpc_receive_count=got,
               grpc_receive_duplicates=dups, grpc_receive_call_p99_ms=round(p99, 3),
               grpc_sent_total=total)
    consumer.shutdown()
    print(json.dumps(out), flush=True)
    os._exit(0)  # the SDK leaves non-daemon threads behind


if __name__ == "__main__":
    main()
