"""The unmodified `rocketmq` 0.4.4 client (cpp 1.2.4) with session credentials: sends N messages,
or consumes N with a push consumer, and prints one RESULT line. Run in a subprocess (a native
crash cannot take pytest with it).

    python cpp_acl_script.py BROKER_ADDR TOPIC ACCESS_KEY SECRET COUNT [push GROUP]
"""
import json
import sys
import threading
import time


def main(addr, topic, access_key, secret, count):
    from rocketmq.client import Message, Producer
    p = Producer("cpp-acl-producer", timeout=3000)
    p.set_namesrv_addr(addr)
    p.set_session_credentials(access_key, secret, "ALIYUN")
    p.start()
    out = {"ok": 0, "errors": []}
    try:
        for i in range(int(count)):
            m = Message(topic)
            m.set_body(b"cpp-acl-%d" % i)
            m.set_tags("acl")
            try:
                r = p.send_sync(m)
                if int(r.status) == 0:
                    out["ok"] += 1
            except Exception as exc:  # noqa: BLE001 - reported, the test decides
                out["errors"].append(str(exc)[:300])
    finally:
        p.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


def push(addr, topic, access_key, secret, count, group, timeout_s=40):
    from rocketmq.client import PushConsumer
    got = []
    lock = threading.Lock()

    def on(msg):
        with lock:
            got.append(msg.body.decode("utf-8", "replace"))

    c = PushConsumer(group)
    c.set_namesrv_addr(addr)
    c.set_session_credentials(access_key, secret, "ALIYUN")
    c.subscribe(topic, on, "*")
    c.start()
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        with lock:
            if len(got) >= int(count):
                break
        time.sleep(0.1)
    c.shutdown()
    print("RESULT " + json.dumps({"got": got}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 6 and sys.argv[6] == "push":
        push(*sys.argv[1:6], sys.argv[7])
    else:
        main(*sys.argv[1:6])
