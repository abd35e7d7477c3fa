"""The unmodified `rocketmq` 0.4.4 client across a failover: a producer sends one message every
100 ms and a push consumer receives, both through the name server, until 20 sends in a row
succeeded after a failure (it followed the failover) or MAX_S passed. Prints READY once both
started and one RESULT JSON line: sends [time, body, status or error] and received bodies.

    python rocketmq_failover_script.py NAMESRV TOPIC MAX_S
"""
import json
import sys
import threading
import time


def main():
    from rocketmq.client import Message, Producer, PushConsumer
    namesrv, topic, duration_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    got, lock = [], threading.Lock()

    def on(msg):
        with lock:
            got.append(msg.body.decode("utf-8", "replace"))

    consumer = PushConsumer("cpp-failover-consumer")
    consumer.set_namesrv_addr(namesrv)
    consumer.subscribe(topic, on, "*")
    consumer.start()
    producer = Producer("cpp-failover-producer", timeout=3000)
    producer.set_namesrv_addr(namesrv)
    producer.start()
    print("READY", flush=True)
    sends = []
    deadline = time.time() + duration_s
    i = 0
    failed_once, ok_run = False, 0
    while time.time() < deadline and not (failed_once and ok_run >= 20):
        m = Message(topic)
        body = f"cpp-{i}"
        m.set_body(body.encode())
        try:
            r = producer.send_sync(m)
            sends.append([time.time(), body, int(r.status)])
            ok_run = ok_run + 1 if int(r.status) == 0 else 0
        except Exception as exc:  # noqa: BLE001 - recorded, the test decides
            sends.append([time.time(), body, type(exc).__name__])
            failed_once, ok_run = True, 0
        i += 1
        time.sleep(0.1)
    time.sleep(5.0)   # let the consumer catch up
    producer.shutdown()
    consumer.shutdown()
    with lock:
        print("RESULT " + json.dumps({"sends": sends, "got": sorted(set(got))}), flush=True)


if __name__ == "__main__":
    main()
