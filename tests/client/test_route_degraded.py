"""Routes naming a broker group without a master are fetched again by the degraded-route
timer, and only those: against a scripted name server (a group without a master is an
election under way, which a standalone broker cannot show on demand)."""
import asyncio

from tests.client.fake_broker import FakeBroker, reply, route_body
from tidemq.producer.producer import Producer
from tidemq.protocol.codes import PERM_READ_WRITE, ResponseCode
from tidemq.protocol.route_json import BrokerData, QueueData, TopicRouteData, encode_topic_route
from tidemq.topic_routes import MIN_REFRESH_GAP_S


def masterless_body(addr):
    """A route whose only group lists a slave (id 1) and no master."""
    return encode_topic_route(TopicRouteData([QueueData("g2", 2, 2, PERM_READ_WRITE)],
                                             [BrokerData("c", "g2", {1: addr})]))


class Script:
    def __init__(self):
        self.addr = None
        self.masterless = {"Elected"}
        self.missing = set()
        self.asked = []

    def __call__(self, cmd):
        if cmd.code == 105:
            topic = cmd.ext["topic"]
            self.asked.append(topic)
            if topic in self.missing:
                return reply(cmd, ResponseCode.TOPIC_NOT_EXIST, remark="no such topic")
            body = masterless_body(self.addr) if topic in self.masterless else \
                route_body(self.addr, queues=2)
            return reply(cmd, body=body)
        return reply(cmd)


def test_only_routes_without_a_master_are_fetched_again():
    async def main():
        script = Script()
        async with FakeBroker(script) as fb:
            script.addr = fb.addr
            producer = await Producer("pg", fb.addr, degraded_route_refresh_s=60).start()
            try:
                routes = producer._instance.routes
                for topic in ("Elected", "Healthy"):
                    await routes.refresh(topic)

                async def degraded_pass():
                    await asyncio.sleep(MIN_REFRESH_GAP_S * 1.5)  # past the refresh gap
                    script.asked.clear()
                    await routes.refresh_degraded()
                    return list(script.asked)

                assert await degraded_pass() == ["Elected"]
                script.masterless.clear()  # the election ended: the route names a master
                assert await degraded_pass() == ["Elected"]
                assert await degraded_pass() == []  # healthy now: no longer fetched

                script.masterless.add("Healthy")  # loses its master, seen by a refresh
                await asyncio.sleep(MIN_REFRESH_GAP_S * 1.5)
                await routes.refresh("Healthy")
                script.missing.add("Healthy")  # then deleted: fetched once, then forgotten
                assert await degraded_pass() == ["Healthy"]
                assert "Healthy" not in routes.routes
                assert await degraded_pass() == []
            finally:
                await producer.shutdown()
    asyncio.run(main())
