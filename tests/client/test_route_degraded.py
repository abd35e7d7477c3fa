"""Routes naming a broker group without a master (an election under way) are fetched again
every degraded_route_refresh_s, and only those: healthy routes wait for the periodic refresh,
and a route whose master is back leaves the fast refresh."""
import asyncio

from tests.client.fake_broker import FakeBroker, reply
from tidemq.producer.producer import Producer
from tidemq.protocol.route_json import BrokerData, QueueData, TopicRouteData, encode_topic_route

PERM_READ_WRITE = 6


class Routes:
    """Answers route queries; "Degraded" names group g2 without a master until `healed`."""

    def __init__(self):
        self.addr = None
        self.healed = False
        self.queries: list[str] = []

    def __call__(self, cmd):
        if cmd.code != 105:
            return reply(cmd)
        topic = cmd.ext["topic"]
        self.queries.append(topic)
        groups = ["g1", "g2"] if topic == "Degraded" else ["g1"]
        masters = {"g1"} | ({"g2"} if self.healed else set())
        route = TopicRouteData([QueueData(g, 2, 2, PERM_READ_WRITE) for g in groups],
                               [BrokerData("c", g, {0: self.addr} if g in masters else {1: self.addr})
                                for g in groups])
        return reply(cmd, body=encode_topic_route(route))


def test_only_routes_without_a_master_are_fetched_again_until_it_is_back():
    async def main():
        script = Routes()
        async with FakeBroker(script) as fb:
            script.addr = fb.addr
            producer = await Producer("pg", fb.addr, degraded_route_refresh_s=0.1).start()
            try:
                routes = producer._instance.routes
                await routes.refresh("Healthy")
                await routes.refresh("Degraded")
                await asyncio.sleep(0.8)
                assert script.queries.count("Healthy") == 1
                assert script.queries.count("Degraded") >= 3
                script.healed = True
                await asyncio.sleep(0.5)  # a fetch sees the master back
                seen = script.queries.count("Degraded")
                await asyncio.sleep(0.5)
                assert script.queries.count("Degraded") == seen
                assert {q.broker_name for q in (await routes.publish_info("Degraded")).queues} \
                    == {"g1", "g2"}
            finally:
                await producer.shutdown()
    asyncio.run(asyncio.wait_for(main(), 30))
