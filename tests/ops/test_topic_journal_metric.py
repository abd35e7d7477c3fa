"""tidemq_topic_journal_fsyncs_total (node/ops/scrape.py) moves with topic creations on a real
broker, agrees with the runtime info's topicJournalSyncs, and shows the group commit:
concurrent creations share fdatasyncs."""
import asyncio
import json

from tests.ops.test_counters_at_zero import samples
from tests.support.raw_client import RawClient
from tidemq.protocol.codes import RequestCode as R

NAME = "tidemq_topic_journal_fsyncs_total"
CREATIONS = 40


async def _create_and_read(addr: str) -> int:
    """Create CREATIONS topics at once (all acknowledged), then the runtime info's count."""
    async with await RawClient.connect(addr) as c:
        replies = await asyncio.gather(*[c.request(R.UPDATE_AND_CREATE_TOPIC, {
            "topic": f"JournalT{i}", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6})
            for i in range(CREATIONS)])
        assert all(r.code == 0 for r in replies), [r.remark for r in replies if r.code]
        info = await c.request(R.GET_BROKER_RUNTIME_INFO)
        return int(json.loads(bytes(info.body))["table"]["topicJournalSyncs"])


def test_topic_journal_fsyncs_counter_moves_with_topic_creations(broker):
    before = samples(broker.admin_url)[(NAME, ())]
    runtime_syncs = asyncio.run(_create_and_read(broker.addr))
    after = samples(broker.admin_url)[(NAME, ())]
    assert after == runtime_syncs  # nothing changed topics between the two reads
    # every acknowledged creation was synced, and concurrent ones shared syncs
    assert before < after < before + CREATIONS, (before, after)
