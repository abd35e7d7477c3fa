"""A batch read through a real name server (ZooKeeper, `tidemq namesrv`, two broker groups in
cluster mode) returns exactly what was produced, from both groups."""
from tests.pipeline.conftest import run
from tests.support.cluster import ClusterHarness, create_topic, wait_route
from tidemq.message import Message
from tidemq.producer.producer import Producer

TOPIC = "PipeCluster"


def test_batch_read_over_two_broker_groups_through_the_name_server(spark, zk_hosts, tmp_path):
    h = ClusterHarness(zk_hosts, tmp_path, {"pa": 1, "pb": 1}).start()
    try:
        h.wait_masters()

        async def produce():
            await create_topic(h, TOPIC, 3)
            await wait_route(h, TOPIC)
            p = await Producer("pipe-cluster-pg", h.namesrv_addr).start()
            sent = {}
            try:
                for i in range(0, 600, 40):  # batches rotate over both groups' queues
                    msgs = [Message(TOPIC, f"c-{j}".encode(), tags=f"t{j % 2}", keys=f"k{j}")
                            for j in range(i, i + 40)]
                    r = await p.send_batch(msgs)
                    assert r.ok, r.status
                    for k, (m, uniq) in enumerate(zip(msgs, r.msg_id.split(","))):
                        sent[(r.queue.broker_name, r.queue.queue_id, r.queue_offset + k)] = \
                            (m.body, m.tags, m.keys, uniq)
            finally:
                await p.shutdown()
            return sent

        sent = run(produce())
        assert {b for b, _, _ in sent} == {"pa", "pb"}
        rows = (spark.read.format("tidemq").option("namesrv", h.namesrv_addr)
                .option("topic", TOPIC).load()
                .select("broker", "queue_id", "queue_offset", "body", "tags", "keys", "msg_id")
                .collect())
        got = {(r.broker, r.queue_id, r.queue_offset): (bytes(r.body), r.tags, r.keys, r.msg_id)
               for r in rows}
        assert len(rows) == len(got) == 600  # nothing read twice
        assert got == sent
    finally:
        h.stop()
