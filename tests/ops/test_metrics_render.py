"""/metrics formatted off the loop (Metrics.render_off_loop): the same text as render(), for
per-topic counters and histograms of many topics, request kinds, gauges and a deleted topic."""
import asyncio

from tidemq.node.ops.counters import Metrics

_VARYING = ("process_", "python_gc_")  # CPU seconds, RSS, gc counts move between two calls


def _stable(text: bytes) -> list[str]:
    lines = text.decode().splitlines()
    return [line for line in lines
            if not (line.split(" ")[2] if line.startswith("#") else line).startswith(_VARYING)]


def test_off_loop_text_equals_render():
    m = Metrics()
    for i in range(300):
        topic = f"T{i}"
        m.put_msgs[topic] += i + 1
        m.put_bytes[topic] += 100 * i
        m.put_latency[(topic, i % 3 == 0)].observe(0.0001 * (i % 50))
        m.get_msgs[topic] += 2
        m.get_latency[topic].observe(0.002)
    m.latency["heartbeat"].observe(0.0003)
    m.requests["SEND_MESSAGE"] += 300
    m.gauge("tidemq_example_gauge", "A test gauge.", lambda: 7)
    m.forget_topic("T5")
    expected = _stable(m.render())
    got = _stable(asyncio.run(m.render_off_loop()))
    assert got == expected
    assert 'tidemq_messages_put_total{topic="T299"} 300.0' in got
    assert not [line for line in got if 'topic="T5"' in line]


def test_send_path_counts_are_folded_before_every_read():
    """The send path's per-topic records (PutTopic) reach put_msgs / put_bytes and the
    histograms in put_latency: both renders show them, repeated folds add up, and a deleted
    topic's record goes with its series."""
    m = Metrics()
    rec = m.put_topic("A")
    rec.msgs, rec.bytes = 3, 300
    m.put_hist(rec, "A", False).observe(0.001)
    assert m.put_latency[("A", False)] is rec.single
    assert 'tidemq_messages_put_total{topic="A"} 3.0' in _stable(m.render())
    rec.msgs, rec.bytes = 2, 50
    got = _stable(asyncio.run(m.render_off_loop()))
    assert 'tidemq_messages_put_total{topic="A"} 5.0' in got
    assert 'tidemq_message_put_body_bytes_total{topic="A"} 350.0' in got
    assert 'tidemq_put_latency_seconds_count{topic="A"} 1.0' in got
    assert rec.msgs == rec.bytes == 0
    m.forget_topic("A")
    assert "A" not in m.put_topics
    assert not [line for line in _stable(m.render()) if 'topic="A"' in line]
