"""A static master + slave group in real broker processes: routes that name the whole group
(node/replication/static_group.py) and consumers that follow suggestWhichBrokerId (client/consumer/pull_target.py)."""
import asyncio
import collections
import json

from tests.ha.test_broker_replication import (
    confirmed,
    in_sync,
    max_offset,
    metrics,
    run,
    wait_for,
)
from tests.support.broker_proc import ha_group, ha_secret_file, ha_slave_settings
from tests.support.raw_client import RC, RawClient
from tidemq.admin import Admin
from tidemq.consumer.broker_calls import PullStatus
from tidemq.consumer.pull import PullConsumer
from tidemq.consumer.push import ConsumeResult, PushConsumer
from tidemq.message import Message
from tidemq.producer.producer import Producer
from tidemq.protocol.route_json import decode_topic_route

FAR = "ha.suggest_slave_lag_bytes=20000"   # ~45 records of ~440 bytes: "far behind" past it


async def route_of(addr, topic):
    c = await RawClient.connect(addr)
    try:
        r = await c.request(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        assert r.code == 0, (r.code, r.remark)
        return decode_topic_route(r.body)
    finally:
        await c.close()


async def stored_offset(addr, group, topic, queue):
    c = await RawClient.connect(addr)
    try:
        r = await c.request(RC.QUERY_CONSUMER_OFFSET,
                            {"consumerGroup": group, "topic": topic, "queueId": str(queue)})
        return int(r.ext["offset"]) if r.code == 0 else -1
    finally:
        await c.close()


async def create_and_fill(addr, topic, queues, per_queue):
    async with Admin(addr) as admin:
        await admin.create_topic(topic, queues)
    async with Producer("pg", addr) as p:
        for start in range(0, per_queue * queues, 200):
            msgs = [Message(topic, b"%06d-" % i + b"x" * 300)
                    for i in range(start, min(start + 200, per_queue * queues))]
            results = await asyncio.gather(*[p.send_async(m) for m in msgs])
            assert all(r.ok for r in results)


def served(b, topic) -> float:
    return sum(v for k, v in metrics(b).items()
               if k.startswith("tidemq_messages_get") and f'topic="{topic}"' in k)


def test_static_group_routes_name_master_and_slaves(broker_factory, tmp_path):
    master, (slave,) = ha_group(broker_factory, tmp_path, master_extra=("ha.node_id=g1-0",),
                                slave_extra=("ha.node_id=g1-1",))
    # A second slave with a non-numeric node id and broker id 3: routes use broker ids.
    port = master.ha_port
    third = broker_factory(*ha_slave_settings(ha_secret_file(tmp_path), port, 3,
                                              "ha.node_id=g1-x", FAR), name="slave3").start()
    wait_for(lambda: in_sync(master, 3), what="both slaves in sync")
    run(create_and_fill(master.addr, "Grp", 1, 10))
    wait_for(lambda: confirmed(slave) == confirmed(third) == max_offset(master),
             what="slaves confirmed")
    # The logged effective config is what runs: a replicated store confirms externally.
    for b in (master, slave):
        line = next(x for x in b.log_text().splitlines() if "effective config:" in x)
        store = json.loads(line.split("effective config: ", 1)[1])["store"]
        assert store["confirm_mode"] == "external", store
    want = {0: master.addr, 1: slave.addr, 3: third.addr}
    r = run(route_of(master.addr, "Grp"))
    assert [b.broker_addrs for b in r.broker_datas] == [want]
    assert [(q.broker_name, q.read_queue_nums) for q in r.queue_datas] == [("broker-a", 1)]
    # A slave names its master (learned in the HA handshake) and itself, never id 0 alone.
    assert run(route_of(slave.addr, "Grp")).broker_datas[0].broker_addrs == \
        {0: master.addr, 1: slave.addr}
    assert run(route_of(third.addr, "Grp")).broker_datas[0].broker_addrs == \
        {0: master.addr, 3: third.addr}
    # The killed slave leaves the master's route.
    third.kill()
    wait_for(lambda: run(route_of(master.addr, "Grp")).broker_datas[0].broker_addrs ==
             {0: master.addr, 1: slave.addr}, what="slave 3 gone from the route")


def test_far_behind_consumer_moves_to_the_slave_in_order_and_commits_to_the_master(
        broker_factory, tmp_path):
    topic, group, queues, per_queue = "FarT", "far-group", 2, 600
    master, (slave,) = ha_group(broker_factory, tmp_path, master_extra=(FAR,),
                                slave_extra=(FAR,))
    wait_for(lambda: in_sync(master), what="in sync")
    run(create_and_fill(master.addr, topic, queues, per_queue))
    wait_for(lambda: confirmed(slave) == max_offset(master), what="slave confirmed")
    got = collections.defaultdict(list)   # queue id -> queue offsets in delivery order

    def listener(msgs):
        for m in msgs:
            got[m.queue_id].append(m.queue_offset)
        return ConsumeResult.SUCCESS

    async def main():
        c = PushConsumer(group, {topic: "*"}, listener, consume_from="FIRST",
                         namesrv_or_broker=master.addr, offset_commit_interval_s=0.2)
        await c.start()
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while sum(map(len, got.values())) < queues * per_queue:
                assert asyncio.get_running_loop().time() < deadline, \
                    {q: len(v) for q, v in got.items()}
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)          # nothing more may arrive (no duplicates)
            await c.commit_offsets()
            moves = c.pull_targets.moves
        finally:
            await c.shutdown()
        return moves

    moves = run(main())
    # Every message exactly once, in queue order, whoever served it.
    assert {q: v for q, v in got.items()} == {q: list(range(per_queue)) for q in range(queues)}
    assert moves >= 2 * queues                # to the slave and back, per queue
    on_slave, on_master = served(slave, topic), served(master, topic)
    assert on_slave >= queues * (per_queue - 100), (on_slave, on_master)  # most from the slave
    assert on_slave + on_master == queues * per_queue
    # Offsets were committed to the master (slaves refuse commits) and replicated to the slave.
    for q in range(queues):
        assert run(stored_offset(master.addr, group, topic, q)) == per_queue
    wait_for(lambda: all(run(stored_offset(slave.addr, group, topic, q)) == per_queue
                         for q in range(queues)), what="offsets replicated to the slave")


def test_pull_consumer_goes_back_to_the_master_when_the_slave_fails(broker_factory, tmp_path):
    topic, group = "FailT", "fail-group"
    master, (slave,) = ha_group(broker_factory, tmp_path, master_extra=(FAR,),
                                slave_extra=(FAR,))
    wait_for(lambda: in_sync(master), what="in sync")
    run(create_and_fill(master.addr, topic, 1, 400))
    wait_for(lambda: confirmed(slave) == max_offset(master), what="slave confirmed")

    async def main():
        async with PullConsumer(group, master.addr) as pc:
            (mq,) = await pc.fetch_queues(topic)
            r = await pc.pull(mq, 0, 32)                 # from the master: "go to slave 1"
            assert r.status is PullStatus.FOUND and r.suggest_broker_id == 1
            assert pc.pull_targets.choose(mq) == (slave.addr, True)
            r = await pc.pull(mq, r.next_begin_offset, 32)   # from the slave: "stay"
            assert r.status is PullStatus.FOUND and r.suggest_broker_id == 1
            assert [m.queue_offset for m in r.messages] == list(range(32, 64))
            slave.kill()
            r = await pc.pull(mq, r.next_begin_offset, 32)   # slave dead: the master, at once
            assert r.status is PullStatus.FOUND
            assert [m.queue_offset for m in r.messages] == list(range(64, 96))
            assert pc.pull_targets.choose(mq)[1] is (r.suggest_broker_id == 1)
            r = await pc.pull(mq, 390, 32)                # near the end: the master keeps it
            assert r.suggest_broker_id == 0 and pc.pull_targets.choose(mq) == (master.addr, False)
            await pc.commit(mq, 400)
        return True

    assert run(main())
    assert run(stored_offset(master.addr, group, topic, 0)) == 400
