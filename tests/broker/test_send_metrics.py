"""The send path's per-topic metrics after a known set of sends: messages and body bytes
stored by topic, and the put latency histograms (one observation per answered request, its
buckets cumulative and ending at the count), whether a group put holds one topic, a
different topic per message, or batches among single sends."""
import asyncio
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, batch_body, send_ext
from tidemq.protocol.codes import RequestCode as R

SPREAD = [f"Spread{i}" for i in range(40)]


def _samples(admin_url: str) -> dict:
    """{(sample name, frozen labels): value} of the broker's /metrics."""
    with urllib.request.urlopen(admin_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


async def _traffic(addr: str) -> tuple[dict, dict, dict]:
    """(messages, body bytes, requests) by topic, for what the broker acknowledged."""
    msgs: dict = {}
    size: dict = {}
    reqs: dict = {}

    def sent(topic, bodies):
        msgs[topic] = msgs.get(topic, 0) + len(bodies)
        size[topic] = size.get(topic, 0) + sum(map(len, bodies))
        reqs[topic] = reqs.get(topic, 0) + 1
    async with await RawClient.connect(addr) as c1, await RawClient.connect(addr) as c2:
        futs = []
        for i in range(200):  # in flight together: each message its own topic run
            topic, body = SPREAD[i % len(SPREAD)], b"s" * (i % 37 + 1)
            futs.append((topic, [body], (c1, c2)[i % 2].start(
                R.SEND_MESSAGE, send_ext(topic, i % 4), body)))
        for i in range(150):  # one topic only
            body = b"o" * (i % 11 + 1)
            futs.append(("OneTopic", [body], c1.start(R.SEND_MESSAGE, send_ext("OneTopic", 1), body)))
        for i in range(30):  # batches among single sends of the same topics
            bodies = [b"b" * (i + k + 1) for k in range(i % 5 + 1)]
            topic = SPREAD[i % 3]
            futs.append((topic, bodies, c2.start(R.SEND_BATCH_MESSAGE, send_ext(topic, 0),
                                                 batch_body([(b, "") for b in bodies]))))
            body = b"m" * (i + 3)
            futs.append((SPREAD[i % 7], [body], c1.start(
                R.SEND_MESSAGE, send_ext(SPREAD[i % 7], 2), body)))
        replies = await asyncio.wait_for(asyncio.gather(*(f for _, _, f in futs)), 30)
        assert [r.code for r in replies] == [0] * len(futs)
        for topic, bodies, _ in futs:
            sent(topic, bodies)
    return msgs, size, reqs


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_put_counters_and_latency_histograms_by_topic(broker_factory, flush):
    """Answered at once, or after the group's fsync (the durability callback's path)."""
    b = broker_factory(f"store.flush_mode={flush}").start()
    msgs, size, reqs = run(_traffic(b.addr))
    s = _samples(b.admin_url)
    for topic in msgs:
        t = frozenset({("topic", topic)})
        assert s[("tidemq_messages_put_total", t)] == msgs[topic], topic
        assert s[("tidemq_message_put_body_bytes_total", t)] == size[topic], topic
        assert s[("tidemq_put_latency_seconds_count", t)] == reqs[topic], topic
        assert s[("tidemq_put_latency_seconds_sum", t)] > 0, topic
        buckets = sorted((float(dict(k)["le"]), v) for (n, k), v in s.items()
                         if n == "tidemq_put_latency_seconds_bucket" and ("topic", topic) in k)
        counts = [v for _, v in buckets]
        assert counts == sorted(counts) and counts[-1] == reqs[topic], topic
    singles = sum(reqs.values()) - 30
    assert s[("tidemq_request_latency_seconds_count", frozenset({("kind", "send")}))] == singles
    assert s[("tidemq_request_latency_seconds_count",
              frozenset({("kind", "send_batch")}))] == 30
