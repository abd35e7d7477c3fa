"""Micro-benchmark of the remoting codec: µs per frame to encode, decode, and both.

The frame is a typical SEND_MESSAGE request: 13 ext fields as cpp 1.2.4 / Go send them
(docs/protocol.md, Send) and a 1 KiB body, once with a JSON header and once with a ROCKETMQ
header.
Prints ONE JSON line. `--quick` runs in well under 10 s; the default takes about 4x longer.
Figures are best-of-N per-frame means: the least noisy estimate of the code's own cost.
`functions` times each accelerated function on its compiled and its pure-Python path
(µs per call, and the ratio); `compiled` says which path the frame figures used.
`dedup_window` is the broker's duplicate window on the batch path (node/sending/dedup.py): µs
per message to check (split) and to remember (remember, with its eviction) 64-message batches
of fresh keys into a window full at its default 100,000 keys, four batches per put as the send
path groups them, timed by the thread's CPU clock; `pure_total_us` is the same on the window's
pure-Python key store when the compiled one is in use. `dedup_single` is the single-send path
over many topics: one-message checks and a put of 256 messages, each of its own topic among
12,500, into the same full window (µs per message, check and remember together).

    .venv/bin/python bench/codec_bench.py [--quick]
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without install

from bench.build_info import build_fields  # noqa: E402
from tidemq.message import MessageExt  # noqa: E402
from tidemq.node.processors import send  # noqa: E402,F401  (registers its pure twin)
from tidemq.node.sending import dedup_keys  # noqa: E402
from tidemq.node.sending.dedup import DedupWindow  # noqa: E402
from tidemq.node.store import commit_log, dispatch, index_file  # noqa: E402,F401  (register their pure twins)
from tidemq.node.store.consume_queue import ConsumeQueue  # noqa: E402
from tidemq.node.store.message import StoreMessage  # noqa: E402
from tidemq.producer import send_codec  # noqa: E402,F401  (registers its pure twin)
from tidemq.protocol import accel, record  # noqa: E402
from tidemq.protocol.codes import RequestCode, SerializeType  # noqa: E402
from tidemq.protocol.remoting import FrameDecoder, RemotingCommand, encode_frame  # noqa: E402

SEND_EXT = {
    "producerGroup": "please_rename_unique_group_name",
    "topic": "TopicTest",
    "defaultTopic": "TBW102",
    "defaultTopicQueueNums": "4",
    "queueId": "3",
    "sysFlag": "0",
    "bornTimestamp": "1700000000123",
    "flag": "0",
    "properties": "UNIQ_KEY\x01AC11000200002A9F0000000000000001\x02WAIT\x01true\x02TAGS\x01TagA",
    "reconsumeTimes": "0",
    "unitMode": "false",
    "batch": "false",
    "bname": "broker-a",
}
BODY = bytes(range(256)) * 4  # 1 KiB


def _best_us_per_op(fn, iterations, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        best = min(best, (time.perf_counter() - start) / iterations)
    return round(best * 1e6, 3)


def _measure(serialize_type, iterations, repeats):
    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, ext=dict(SEND_EXT), body=BODY,
                                  serialize_type=serialize_type)
    frame = encode_frame(cmd)
    decoder = FrameDecoder()
    assert decoder.feed(frame) == [cmd]  # the benchmark measures a correct round trip

    def roundtrip():
        decoder.feed(encode_frame(cmd))

    return {
        "frame_bytes": len(frame),
        "encode_us": _best_us_per_op(lambda: encode_frame(cmd), iterations, repeats),
        "decode_us": _best_us_per_op(lambda: decoder.feed(frame), iterations, repeats),
        "roundtrip_us": _best_us_per_op(roundtrip, iterations, repeats),
    }


def _pull_body() -> bytes:
    """32 stored 1 KiB records: a typical pull reply body."""
    host = record.encode_host("127.0.0.1", 10911)
    size = record.record_size(len(BODY), 9, 0)
    buf = bytearray(size * 32)
    for i in range(32):
        record.encode_into(buf, i * size, b"TopicTest", 0, 0, i, i * size, 0, 0, host, 0, host, 0,
                           0, BODY, b"")
    return bytes(buf)


def _function_cases():
    """name -> arguments: one typical hot-path call of each accelerated function."""
    props = SEND_EXT["properties"].encode()
    entries = [(0, BODY, SEND_EXT["properties"])] * 32
    batch = accel.PURE["encode_batch_body"](entries)
    binary = encode_frame(RemotingCommand.request(RequestCode.SEND_MESSAGE, ext=dict(SEND_EXT),
                                                  serialize_type=SerializeType.ROCKETMQ))
    header = binary[8:]
    host = record.encode_host("127.0.0.1", 10911)
    return {
        "encode_into": (bytearray(4096), 0, b"TopicTest", 3, 0, 7, 4096, 0, 1700000000123, host,
                        1700000000124, host, 0, 0, BODY, props, True, 0),
        "decode_properties": (props,),
        "prop_fields": (props,),
        # with the broker's ownership pass (system_properties.from_client), as the send path
        "decode_batch": (batch, b"", 4 << 20, 1024, b"CLUSTER\x01c"),
        # a batch reply's msgId: 32 offsetMsgIds from the put's dispatch requests
        "offset_msg_ids": (host, [("TopicTest", 0, i, i * 1200, 1200, 0, 1700000000123, None,
                                   f"UNIQ{i:028d}", 0) for i in range(32)], 0, 32, 3),
        "encode_batch_body": (entries,),
        "decode_binary_ext": (header, 21, len(header)),
        "json_header_fields": (encode_frame(RemotingCommand.request(
            RequestCode.SEND_MESSAGE, ext=dict(SEND_EXT)))[8:],),
        "wire_messages": (StoreMessage, "TopicTest", 3, [(0, BODY, props)] * 32, 0, 1700000000123,
                          host, host, 0),
        "record_views": (MessageExt, _pull_body(), "broker-a"),
        # one dispatch slice of 32 requests, 3 names each, into a fresh index file
        "index_entries": (bytearray(40 + 1024 * 4 + 4096 * 20), 1024, 40 + 1024 * 4, 4096, 1, 0,
                          0, 0, [("TopicTest", 0, i, i * 1200, 1200, 0, 1700000000123,
                                  f"order-{i} k", f"UNIQ{i:028d}", 0) for i in range(32)],
                          0, 0, 0, {}),
        # the same slice's consume-queue units: 8 queues, each the next units of its queue
        "queue_units": ([("TopicTest", i % 8, 100 + i // 8, i * 1200, 1200, 0, 1700000000123,
                          None, None, 0) for i in range(32)],
                        {("TopicTest", q): ConsumeQueue(None, q + 1, "TopicTest", q, 0, 99)
                         for q in range(8)}, {}),
    }


def _functions(iterations, repeats):
    mod = accel.compiled_module()
    out = {}
    for name, args in _function_cases().items():
        pure = accel.PURE[name]
        row = {"pure_us": _best_us_per_op(lambda f=pure, a=args: f(*a), iterations // 4, repeats)}
        if mod is not None:
            mod.set_fallback(name, pure)
            fast = getattr(mod, name)
            row["compiled_us"] = _best_us_per_op(lambda f=fast, a=args: f(*a), iterations // 4, repeats)
            row["speedup"] = round(row["pure_us"] / row["compiled_us"], 1)
        out[name] = row
    return out


DEDUP_KEYS, DEDUP_BATCH, DEDUP_PUT = 100_000, 64, 4   # window bound, batch, batches per put


def _dedup_batch(n: int, props: list, topic: str = "TopicTest"):
    """Batch n: its store messages (fresh UNIQ_KEY strings, as the send path decodes them) and
    the dispatch requests a put would return for them."""
    host = record.encode_host("127.0.0.1", 10911)
    tag = b"%08X" % n
    msgs = StoreMessage.many_from_wire(topic, 3, [(0, b"x", p.replace(b"00000000", tag, 1))
                                                  for p in props], 0, 1, host, host, 0)
    now_ms, base = int(time.time() * 1000), n * len(props)
    return msgs, [(topic, 3, base + i, (base + i) * 1100, 1100, 0, now_ms, None, m.uniq_key, 0)
                  for i, m in enumerate(msgs)]


def _dedup_window(puts: int, repeats: int, pure: bool = False) -> dict:
    """µs per message of the window's check and remember at steady state (best of repeats);
    pure: on the pure-Python key store whichever is in use."""
    props = [record.encode_properties({"UNIQ_KEY": "AC11000200002A9F00000000%08X" % i,
                                       "WAIT": "true", "TAGS": "TagA"})
             for i in range(DEDUP_BATCH)]
    best = [float("inf"), float("inf")]
    clock, n = time.thread_time, 0
    for _ in range(repeats):
        window = DedupWindow(300_000, DEDUP_KEYS)
        if pure:
            window._keys = dedup_keys.KeyWindow()
        for _ in range(DEDUP_KEYS // DEDUP_BATCH + 1):   # fill: every remember evicts from now on
            msgs, reqs = _dedup_batch(n, props)
            n += 1
            window.split(msgs, "TopicTest")
            window.remember(reqs, msgs)
        spent = [0.0, 0.0]
        for _ in range(puts):
            group = [_dedup_batch(n + i, props) for i in range(DEDUP_PUT)]
            n += DEDUP_PUT
            put_msgs = [m for msgs, _ in group for m in msgs]
            put_reqs = [r for _, reqs in group for r in reqs]
            t0 = clock()
            for msgs, _ in group:
                window.split(msgs, "TopicTest")
            t1 = clock()
            window.remember(put_reqs, put_msgs)
            spent[0] += t1 - t0
            spent[1] += clock() - t1
        assert len(window) == DEDUP_KEYS and window.suppressed == 0
        per = puts * DEDUP_PUT * DEDUP_BATCH
        best = [min(b, s / per) for b, s in zip(best, spent)]
    out = {"keys": DEDUP_KEYS, "batch": DEDUP_BATCH, "check_us": round(best[0] * 1e6, 3),
           "remember_us": round(best[1] * 1e6, 3), "total_us": round(sum(best) * 1e6, 3)}
    if dedup_keys.COMPILED and not pure:
        out["pure_total_us"] = _dedup_window(puts, repeats, pure=True)["total_us"]
    return out


class _Msg:
    """What the single-send check reads of a store message."""
    __slots__ = ("topic", "uniq_key", "properties")

    def __init__(self, topic: str, uniq_key: str):
        self.topic, self.uniq_key, self.properties = topic, uniq_key, None


DEDUP_TOPICS, DEDUP_SINGLE_PUT = 12_500, 256


def _single_put(n: int, topics: list) -> tuple[list, list]:
    now_ms, base = int(time.time() * 1000), n * DEDUP_SINGLE_PUT
    msgs = [_Msg(topics[(base + i) % DEDUP_TOPICS], "AC11000200002A9F%016X" % (base + i))
            for i in range(DEDUP_SINGLE_PUT)]
    return msgs, [(m.topic, 0, base + i, (base + i) * 1100, 1100, 0, now_ms, None, m.uniq_key, 0)
                  for i, m in enumerate(msgs)]


def _dedup_single(puts: int, repeats: int) -> dict:
    """µs per message of single sends over many topics: a check each, then the put."""
    topics = [f"Topic{i}" for i in range(DEDUP_TOPICS)]
    best, n = float("inf"), 0
    for _ in range(repeats):
        window = DedupWindow(300_000, DEDUP_KEYS)
        for _ in range(DEDUP_KEYS // DEDUP_SINGLE_PUT + 1):
            msgs, reqs = _single_put(n, topics)
            n += 1
            window.remember(reqs, msgs)
        spent = 0.0
        for _ in range(puts):
            msgs, reqs = _single_put(n, topics)
            n += 1
            t0 = time.thread_time()
            for m in msgs:
                window.split([m])
            window.remember(reqs, msgs)
            spent += time.thread_time() - t0
        assert len(window) == DEDUP_KEYS and window.suppressed == 0
        best = min(best, spent / (puts * DEDUP_SINGLE_PUT))
    return {"keys": DEDUP_KEYS, "topics": DEDUP_TOPICS, "total_us": round(best * 1e6, 3)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (< 10 s)")
    args = parser.parse_args(argv)
    iterations, repeats = (20_000, 5) if args.quick else (50_000, 7)
    result = {
        "bench": "codec",
        "python": platform.python_version(),
        "ext_fields": len(SEND_EXT),
        "body_bytes": len(BODY),
        "json": _measure(SerializeType.JSON, iterations, repeats),
        "rocketmq": _measure(SerializeType.ROCKETMQ, iterations, repeats),
        "functions": _functions(iterations, repeats),
        "dedup_window": _dedup_window(iterations // 100, repeats - 2),
        "dedup_single": _dedup_single(iterations // 200, repeats - 2),
        **build_fields(),
    }
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
