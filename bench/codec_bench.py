"""Micro-benchmark of the remoting codec: µs per frame to encode, decode, and both.

The frame is a typical SEND_MESSAGE request: 13 ext fields as cpp 1.2.4 / Go send them
(docs/protocol.md, Send) and a 1 KiB body, once with a JSON header and once with a ROCKETMQ
header.
Prints ONE JSON line. `--quick` runs in well under 10 s; the default takes about 4x longer.
Figures are best-of-N per-frame means: the least noisy estimate of the code's own cost.

    .venv/bin/python bench/codec_bench.py [--quick]
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without install

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
    }
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
