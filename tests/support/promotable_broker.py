"""`python tests/support/promotable_broker.py [broker args]`: `python -m tidemq.node` whose process
calls Replication.become_master(last epoch + 1) on SIGUSR2, the explicit role switch a
coordinator would make, for tests that promote a static slave in a real process."""
import asyncio
import logging
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tidemq.node import broker as broker_module
from tidemq.node.main import run_broker

_start = broker_module.Broker.start


async def _start_promotable(self):
    await _start(self)
    loop = asyncio.get_running_loop()

    async def promote():
        epoch = self.replication.service.last_epoch + 1
        await self.replication.become_master(epoch)
        logging.getLogger("tidemq.test").info("PROMOTED to master of epoch %d", epoch)

    loop.add_signal_handler(signal.SIGUSR2, lambda: loop.create_task(promote()))


broker_module.Broker.start = _start_promotable
sys.exit(run_broker(sys.argv[1:]))
