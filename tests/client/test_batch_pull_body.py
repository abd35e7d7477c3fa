"""The batched pull's request body (client/consumer/batch_pull.py request_body): byte for byte
what json.dumps writes for the same rows, subscriptions and expression types, whatever the
topic names hold, however often a queue is listed again (its cached row head)."""
import json
import random

from tidemq.consumer.batch_pull import PullWaiter, request_body
from tidemq.consumer.selector import MessageSelector, subscription_filter
from tidemq.topic_routes import MessageQueue

NAMES = ["Plain", "with\"quote", "back\\slash", "ünï", "tab\there", "日本", "%RETRY%g"]


def reference(batch, filters):
    topics = [t for t in dict.fromkeys(w.mq.topic for w in batch) if t in filters]
    return json.dumps({
        "queues": [[w.mq.topic, w.mq.queue_id, w.offset, w.commit] for w in batch],
        "subscriptions": {t: filters[t].expression for t in topics},
        "expressionTypes": {t: filters[t].expression_type for t in topics
                            if filters[t].expression_type != "TAG"},
    }, separators=(",", ":")).encode()


def test_the_body_is_what_json_writes():
    rng = random.Random(11)
    filters = {NAMES[0]: subscription_filter("*"), NAMES[1]: subscription_filter("a || b"),
               NAMES[2]: subscription_filter(MessageSelector.by_sql("x > 1")),
               NAMES[5]: subscription_filter("日本")}
    heads: dict = {}
    for _ in range(200):
        mqs = rng.sample([MessageQueue(t, "b", q) for t in NAMES for q in range(4)],
                         rng.randint(1, 20))
        batch = [PullWaiter(mq, rng.choice([0, 7, 2 ** 62]), rng.choice([-1, 0, 5, 2 ** 40]),
                            lambda ctx, outcome: None) for mq in mqs]
        body = request_body(batch, filters, heads)
        assert body == reference(batch, filters)
        assert json.loads(body)["queues"] == [[w.mq.topic, w.mq.queue_id, w.offset, w.commit]
                                              for w in batch]
    assert len(heads) == len(NAMES) * 4  # one head per queue, reused
