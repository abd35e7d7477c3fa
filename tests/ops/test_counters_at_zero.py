"""Event counters exist at 0 before their first event, so dashboards and alert rules over
rate()/increase() show 0 instead of "No data": SYSTEM_BUSY reasons from the start, retry and
dead-letter counters for every group once it has a consumer."""
from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.ops.test_operator_e2e import consume_until, produce, run
from tidemq.node.ops.counters import BUSY_REASONS


def samples(admin_url: str) -> dict:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_event_counters_start_at_zero(broker):
    first = samples(broker.admin_url)
    for reason in BUSY_REASONS:
        assert first[("tidemq_system_busy_rejections_total", (("reason", reason),))] == 0
    run(produce(broker.addr, "ZeroT", [b"a", b"b"]))
    run(consume_until(broker.addr, "ZeroT", "zero-g", {b"a", b"b"}))
    after = samples(broker.admin_url)
    for name in ("tidemq_retry_messages_total", "tidemq_dlq_messages_total"):
        assert after[(name, (("consumer_group", "zero-g"),))] == 0
