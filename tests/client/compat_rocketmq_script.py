"""Runs the unmodified PyPI `rocketmq` 0.4.4 client (cpp 1.2.4 via ctypes) against a broker and
prints one JSON line of what happened. Run in a subprocess by test_compat_rocketmq.py, so a
crash of the native library cannot take the test runner with it.

    python compat_rocketmq_script.py SCENARIO BROKER_ADDR TOPIC
"""
import json
import sys
import threading
import time


def producer_scenario(addr, topic):
    from rocketmq.client import Message, Producer
    p = Producer("compat-producer", timeout=5000)
    p.set_namesrv_addr(addr)
    p.start()
    out = {"sync": [], "orderly": [], "oneway": 0, "batch": None}

    def msg(body, tags="cpp", keys=None):
        m = Message(topic)
        m.set_body(body)
        m.set_tags(tags)
        if keys:
            m.set_keys(keys)
        return m

    for i in range(10):
        r = p.send_sync(msg(b"cpp-sync-%d" % i, keys=f"ck{i}"))
        out["sync"].append([int(r.status), r.msg_id, r.offset])
    for i in range(5):
        p.send_oneway(msg(b"cpp-oneway-%d" % i))
        out["oneway"] += 1
    for i in range(10):
        r = p.send_orderly(msg(b"cpp-ord-%d" % i), 7)
        out["orderly"].append([int(r.status), r.msg_id, r.offset])
    big = b"cpp-big-" + b"0123456789" * 1000  # > 4 KiB: cpp compresses it
    r = p.send_sync(msg(big, tags="big"))
    out["big"] = [int(r.status), r.msg_id]
    try:
        r = p.send_batch([msg(b"cpp-batch-%d" % i) for i in range(5)])
        out["batch"] = [int(r.status), r.msg_id, r.offset]
    except Exception as exc:  # noqa: BLE001 - reported, the test decides
        out["batch_error"] = repr(exc)
    p.shutdown()
    return out


def push_scenario(addr, topic, expression, expect, timeout_s):
    from rocketmq.client import PushConsumer
    got = []
    lock = threading.Lock()

    def on(msg):
        with lock:
            got.append({"body": msg.body.decode("utf-8", "replace")[:64], "len": len(msg.body),
                        "tags": msg.tags.decode() if isinstance(msg.tags, bytes) else msg.tags,
                        "id": msg.id.decode() if isinstance(msg.id, bytes) else msg.id})

    c = PushConsumer("compat-push")
    c.set_namesrv_addr(addr)
    c.subscribe(topic, on, expression)
    c.start()
    print("READY", flush=True)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        with lock:
            if len(got) >= expect:
                break
        time.sleep(0.1)
    time.sleep(1.0)  # anything unexpected would arrive now
    c.shutdown()
    return {"got": got}


def delay_scenario(addr, topic):
    """Delay level 1 on send (the DELAY property)."""
    from rocketmq.client import Message, Producer
    p = Producer("compat-delay-producer", timeout=5000)
    p.set_namesrv_addr(addr)
    p.start()
    sent = []
    for i in range(3):
        m = Message(topic)
        m.set_body(b"cpp-delay-%d" % i)
        m.set_delay_time_level(1)
        sent.append([time.time(), int(p.send_sync(m).status)])
    p.shutdown()
    return {"sent": sent}


def retry_scenario(addr, topic, expect, timeout_s):
    """A push consumer that fails each message once: cpp sends it back (36), the broker returns it
    through %RETRY%<group> after the retry delay."""
    from rocketmq.client import PushConsumer
    got = []
    lock = threading.Lock()

    def on(msg):
        with lock:
            got.append({"body": msg.body.decode(), "times": msg.reconsume_times,
                        "at": time.time()})
            if msg.reconsume_times == 0:
                raise RuntimeError("fail once")

    c = PushConsumer("compat-retry")
    c.set_namesrv_addr(addr)
    c.subscribe(topic, on, "*")
    c.start()
    print("READY", flush=True)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        with lock:
            if len(got) >= expect:
                break
        time.sleep(0.1)
    time.sleep(1.0)
    c.shutdown()
    return {"got": got}


def pull_scenario(addr, topic):
    from rocketmq.client import PullConsumer
    c = PullConsumer("compat-pull")
    c.set_namesrv_addr(addr)
    c.start()
    got = [m.body.decode("utf-8", "replace")[:64] for m in c.pull(topic)]
    c.shutdown()
    return {"got": got}


def main():
    scenario, addr, topic = sys.argv[1:4]
    if scenario == "producer":
        out = producer_scenario(addr, topic)
    elif scenario == "push":
        out = push_scenario(addr, topic, sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
    elif scenario == "delay":
        out = delay_scenario(addr, topic)
    elif scenario == "retry":
        out = retry_scenario(addr, topic, int(sys.argv[4]), float(sys.argv[5]))
    else:
        out = pull_scenario(addr, topic)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
