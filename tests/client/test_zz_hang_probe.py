import time
from client.consumer import PushConsumer
from tests.client.conftest import run
from tests.client.test_e2e_consume import create

def test_probe(broker):
    async def main():
        await create(broker.addr, "HangT", 2)
        c = PushConsumer("hang-g", {"HangT": "*"}, lambda m: None, namesrv_or_broker=broker.addr)
        await c.start()
        assert False, "boom"
    t0 = time.time()
    try:
        run(main(), 60)
    finally:
        print("run took", time.time() - t0)
