"""The unmodified `rocketmq` 0.4.4 client across a failover: a producer sends one message every
100 ms and a push consumer receives, both through the name server, until 20 sends in a row
succeeded after a failure (it followed the failover) or MAX_S passed. Then the consumer has
FOLLOW_S to receive every acknowledged message; if it has not, it is restarted (same group,
as a supervisor would) and the new one has MAX_S to receive the rest from the group's
offsets. Prints READY once both started and one RESULT JSON line: sends [time, body, status
or error], received [time, body, consumer 1 or 2] (first receipt of each body), restarted.

Why the restart: in rocketmq-client-cpp 2.0 a push consumer whose broker died retries its
pulls without pause, each taking its client factory's transport lock, and the route refresh
that would find the new master then fails to get that lock ("GetTransport ... get timed_mutex
timeout" in the client's log; apache/rocketmq-client-cpp#202). Seen here: one consumer in
five missed three refreshes in a row. The producer gets a factory of its own (another
instance name) so the consumer's retries cannot starve its refresh too; sharing one, CI once
saw the producer miss three.

    python rocketmq_failover_script.py NAMESRV TOPIC MAX_S
"""
import json
import sys
import threading
import time

FOLLOW_S = 35.0  # one route refresh (30 s) and some


def main():
    from rocketmq.client import Message, Producer, PushConsumer
    namesrv, topic, duration_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    got, lock = {}, threading.Lock()

    def start_consumer(n: int):
        def on(msg):
            with lock:
                got.setdefault(msg.body.decode("utf-8", "replace"), (time.time(), n))

        consumer = PushConsumer("cpp-failover-consumer")
        consumer.set_instance_name(f"cpp-failover-consumer-{n}")
        consumer.set_namesrv_addr(namesrv)
        consumer.subscribe(topic, on, "*")
        consumer.start()
        return consumer

    def wait_received(bodies: set, seconds: float) -> bool:
        deadline = time.time() + seconds
        while time.time() < deadline:
            with lock:
                if bodies <= got.keys():
                    return True
            time.sleep(0.2)
        return False

    consumer = start_consumer(1)
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
    producer.shutdown()
    acked = {body for _, body, status in sends if status == 0}
    restarted = not wait_received(acked, FOLLOW_S)
    if restarted:
        consumer.shutdown()
        consumer = start_consumer(2)
        wait_received(acked, duration_s)
    consumer.shutdown()
    with lock:
        received = sorted([t, body, n] for body, (t, n) in got.items())
    print("RESULT " + json.dumps({"sends": sends, "got": received, "restarted": restarted}),
          flush=True)


if __name__ == "__main__":
    main()
