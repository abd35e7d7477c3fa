"""A longer fuzz run than the test suite's: mutated valid inputs against every decoder that
reads peer bytes, then against a live broker. Prints ONE JSON line.

    .venv/bin/python bench/fuzz_run.py [--seconds S] [--seed N] [--no-broker]

Targets (each gets S seconds): the remoting frame decoder (JSON and binary headers), the HA
frame decoder, heartbeat JSON bodies, message properties, CommitLog records, the ACL check.
Inputs are valid samples mutated by bit flips, byte overwrites, truncation, duplication and
splicing (more reach deep code than uniform random bytes do). For each target the only allowed
outcomes are a result or the decoder's own error type; anything else is counted in
`unexpected` with the first few reprs. The live phase sends mutated frames to a real broker
over many connections and then checks that it still answers a well-formed request and that its
commit log did not move from garbage alone.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.build_info import build_fields  # noqa: E402
from tidemq.acl_signing import Credentials, sign_ext  # noqa: E402
from tidemq.ha import protocol as hp  # noqa: E402
from tidemq.protocol import record as rec  # noqa: E402
from tidemq.protocol.codes import RequestCode, SerializeType  # noqa: E402
from tidemq.protocol.remoting import FrameDecoder, ProtocolError, RemotingCommand, encode_frame  # noqa: E402
from tidemq.protocol.route_json import ConsumerData, HeartbeatData, SubscriptionData, decode_heartbeat, encode_heartbeat  # noqa: E402


def mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(6)
        if op == 0 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            i = rng.randrange(len(b))
            b[i] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        elif op == 2 and b:
            del b[rng.randrange(len(b)):]
        elif op == 3 and b:
            i = rng.randrange(len(b))
            b[i:i] = b[i:i + rng.randint(1, 64)]
        elif op == 4:
            other = rng.choice(pool)
            i = rng.randrange(len(other) + 1)
            b += other[i:]
        else:
            i = rng.randrange(len(b) + 1)
            b[i:i] = os.urandom(rng.randint(1, 16))
    return bytes(b)


def remoting_samples() -> list[bytes]:
    out = []
    for st in (SerializeType.JSON, SerializeType.ROCKETMQ):
        for code, ext, body in ((RequestCode.SEND_MESSAGE, {"topic": "T", "queueId": "1",
                                                             "properties": "K\x01v\x02"}, b"x" * 40),
                                (RequestCode.PULL_MESSAGE, {"topic": "T", "consumerGroup": "g",
                                                            "queueOffset": "0"}, b""),
                                (RequestCode.HEART_BEAT, {}, _heartbeat())):
            out.append(encode_frame(RemotingCommand.request(code, ext, body, serialize_type=st)))
    return out


def _heartbeat() -> bytes:
    return encode_heartbeat(HeartbeatData("c@1", ["pg"], [ConsumerData(
        "g", subscriptions=[SubscriptionData("T", "a || b", ["a", "b"])])]))


def ha_samples() -> list[bytes]:
    return [hp.encode(hp.Hello(1, b"n" * 32, "m", "c")), hp.encode(hp.Ack(1, 123)),
            hp.encode(hp.Heartbeat(1, 5, 6)),
            hp.encode(hp.Transfer(epoch=1, data_epoch=1, data_epoch_start=0, offset=0,
                                  confirmed=0, data=b"d" * 100))]


def record_samples() -> list[bytes]:
    buf = bytearray(4096)
    size = rec.encode_into(buf, 0, b"Topic", 1, 0, 7, 0, 0, 1, rec.encode_host("127.0.0.1", 1),
                           2, rec.encode_host("127.0.0.1", 2), 0, 0, b"body", b"K\x01v\x02")
    return [bytes(buf[:size])]


def _remoting(data):
    try:
        FrameDecoder(1 << 20).feed(data)
    except ProtocolError:
        pass


def _ha(data):
    try:
        hp.FrameDecoder(1 << 20).frames(data)
    except hp.HAProtocolError:
        pass


def _heartbeat_target(data):
    try:
        decode_heartbeat(data)
    except ProtocolError:
        pass


def _record(data):
    try:
        rec.decode_record(data, 0, len(data), verify=True)
    except rec.RecordError:
        pass


def _acl_target_factory(work_dir):
    from tidemq.node.security.acl.validator import AclValidator
    path = os.path.join(work_dir, "acl.toml")
    with open(path, "w") as f:
        f.write('[[accounts]]\naccess_key = "a"\nsecret_key = "s"\n'
                'default_topic_perm = "PUB"\ndefault_group_perm = "SUB"\n')
    os.chmod(path, 0o600)
    validator = AclValidator(path)
    decoder_error = ProtocolError

    def target(data):
        try:
            cmds = FrameDecoder(1 << 20).feed(data)
        except decoder_error:
            return
        for cmd in cmds:
            result = validator.check("127.0.0.1", cmd)
            assert result is None or result.startswith("[ACL]"), result
    return target


def acl_samples() -> list[bytes]:
    creds = Credentials("a", "s")
    return [encode_frame(RemotingCommand.request(
        code, sign_ext(ext, body, creds), body))
        for code, ext, body in ((RequestCode.SEND_MESSAGE, {"topic": "T"}, b"b"),
                                (RequestCode.HEART_BEAT, {}, _heartbeat()),
                                (RequestCode.PULL_MESSAGE, {"topic": "T", "consumerGroup": "g"}, b""))]


def fuzz(name, target, samples, seconds, rng, out):
    deadline = time.monotonic() + seconds
    n = bad = 0
    first = []
    while time.monotonic() < deadline and n < 5_000_000:
        data = mutate(rng, rng.choice(samples), samples)
        n += 1
        try:
            target(data)
        except Exception as exc:  # noqa: BLE001 - counting is the point
            bad += 1
            if len(first) < 3:
                first.append(f"{type(exc).__name__}: {exc}"[:200])
    out[f"{name}_inputs"] = n
    out[f"{name}_unexpected"] = bad
    if first:
        out[f"{name}_unexpected_examples"] = first


def live(addr, seconds, rng, samples, out):
    """Mutated frames over many short connections (plain blocking sockets: one per round)."""
    import socket
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + seconds
    conns = frames = 0
    while time.monotonic() < deadline and conns < 20_000:
        try:
            with socket.create_connection((host, int(port)), timeout=1) as s:
                conns += 1
                for _ in range(rng.randint(1, 8)):
                    s.sendall(mutate(rng, rng.choice(samples), samples))
                    frames += 1
        except OSError:  # the broker closed a bad connection while we were still writing
            pass

    async def probe():
        from tests.support.raw_client import RawClient
        async with await RawClient.connect(addr) as c:
            return await c.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})

    out.update(live_connections=conns, live_frames=frames,
               live_broker_answers=asyncio.run(probe()).code == 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="per target")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--no-broker", action="store_true", help="skip the live broker phase")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    out = {"seed": args.seed, "seconds_per_target": args.seconds}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tidemq-fuzz-") as d:
        targets = (("remoting", _remoting, remoting_samples()), ("ha", _ha, ha_samples()),
                   ("heartbeat", _heartbeat_target, [_heartbeat()]),
                   ("properties", rec.decode_properties, [b"K\x01v\x02TAGS\x01a\x02"]),
                   ("record", _record, record_samples()),
                   ("acl", _acl_target_factory(d), acl_samples()))
        for name, target, samples in targets:
            fuzz(name, target, samples, args.seconds, rng, out)
        if not args.no_broker:
            from tests.support.broker_proc import BrokerProcess
            b = BrokerProcess(os.path.join(d, "store")).start()
            try:
                before = _max_offset(b)
                live(b.addr, args.seconds, rng, remoting_samples(), out)
                # A mutation can still be a valid send (then it is stored): reported, not judged.
                out["live_log_bytes_written"] = _max_offset(b) - before
                out["live_broker_alive"] = b.alive
            finally:
                b.stop()
                b.kill()
    out["unexpected_total"] = sum(v for k, v in out.items() if k.endswith("_unexpected"))
    out["bench_seconds"] = round(time.perf_counter() - t0, 1)
    out.update(build_fields())
    print(json.dumps(out, sort_keys=True))
    return 1 if out["unexpected_total"] or out.get("live_broker_alive") is False else 0


def _max_offset(b) -> int:
    import re
    import urllib.request
    text = urllib.request.urlopen(b.admin_url + "/metrics", timeout=5).read().decode()
    return int(float(re.search(r"^tidemq_store_max_offset_bytes (\S+)$", text, re.M).group(1)))


if __name__ == "__main__":
    sys.exit(main())
