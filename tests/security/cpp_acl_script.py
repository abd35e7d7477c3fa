"""The unmodified `rocketmq` 0.4.4 client (cpp 1.2.4) with session credentials: sends N messages
and prints one RESULT line. Run in a subprocess (a native crash cannot take pytest with it).

    python cpp_acl_script.py BROKER_ADDR TOPIC ACCESS_KEY SECRET COUNT
"""
import json
import sys


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


if __name__ == "__main__":
    main(*sys.argv[1:6])
