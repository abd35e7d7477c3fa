"""The receipt state survives a restart and a SIGKILL: an acknowledged message never comes
back, every un-acknowledged one does (after its invisible duration), and no sent message is
lost."""
from __future__ import annotations

import time

from tests.grpc.conftest import GRPC_SETTINGS
from tests.grpc.test_grpc_messaging import receive_until


def _send(sdk, broker, topic, bodies):
    """All in one queue (one message group), so acknowledgements land out of order there."""
    p = sdk(broker)
    p.ok("producer", topics=[topic])
    for body in bodies:
        p.ok("send", topic=topic, body=body, group="one")
    p.close()


def _receive_rest(sdk, broker, group, topic, want, invisible_s=30):
    c = sdk(broker)
    c.ok("simple", group=group, topic=topic, await_s=1)
    got = receive_until(c, want, invisible_s=invisible_s, deadline_s=30)
    time.sleep(1.0)
    got += c.ok("receive", max=32, invisible_s=invisible_s)["messages"]  # nothing more
    return got


def test_acknowledgements_and_invisibility_survive_a_restart(sdk, broker_factory):
    b = broker_factory(*GRPC_SETTINGS).start()
    _send(sdk, b, "DurT", [f"m{i}" for i in range(6)])
    c = sdk(b)
    c.ok("simple", group="DurG", topic="DurT", await_s=1)
    first = {m["body"]: m for m in receive_until(c, 6, invisible_s=3)}
    assert len(first) == 6
    for body in ("m0", "m2", "m4"):
        c.ok("ack", token=first[body]["token"])
    c.close()
    b.restart()
    got = _receive_rest(sdk, b, "DurG", "DurT", 3)
    assert sorted((m["body"], m["attempt"]) for m in got) == [("m1", 2), ("m3", 2), ("m5", 2)]


def test_sigkill_loses_no_message_and_redelivers_every_unacked_one(sdk, broker_factory):
    b = broker_factory(*GRPC_SETTINGS, "offsets_flush_interval_ms=200").start()
    _send(sdk, b, "KillT", [f"k{i}" for i in range(10)])
    c = sdk(b)
    c.ok("simple", group="KillG", topic="KillT", await_s=1)
    first = {m["body"]: m for m in receive_until(c, 10, invisible_s=2)}
    assert len(first) == 10
    acked = {f"k{i}" for i in range(0, 10, 2)}
    for body in sorted(acked):
        c.ok("ack", token=first[body]["token"])
    c.close()
    _send(sdk, b, "KillT", ["late0", "late1"])  # stored, never received before the kill
    time.sleep(1.0)  # past the receipt state's flush interval
    b.kill()
    b.start()
    got = _receive_rest(sdk, b, "KillG", "KillT", 7)
    bodies = sorted(m["body"] for m in got)
    assert bodies == sorted({f"k{i}" for i in range(1, 10, 2)} | {"late0", "late1"})
