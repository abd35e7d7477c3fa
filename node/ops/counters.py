"""Broker metrics: plain counters on the hot path, turned into Prometheus text at scrape time.

prometheus_client's own Counter/Histogram take a lock and a label lookup per call (about 1-2 µs
each); at 30,000+ sends/s that is several percent of the broker. So the request path bumps
plain ints and dicts (single-threaded: they are only touched on the event loop thread), and
a custom collector in this node's own CollectorRegistry reads them when /metrics is scraped.

Names follow Prometheus conventions (`tidemq_*_total` counters, units in names); every name is
listed in node/ops/metric_catalog.py. Label cardinality is bounded: topic labels only for topics that
exist (max_topics; a deleted topic's series are dropped), request labels from a fixed set.
Scrape-time blocks (store, consumer lag, ZooKeeper) live in node/ops/scrape.py.
The broker's /metrics (render_off_loop) copies the hot-path tables on the loop thread and
builds and formats their text in an executor thread: at 10,000+ topics (40+ series each) that
is seconds of work the loop would otherwise stall for; the text is render()'s.
"""
from __future__ import annotations

import asyncio
import bisect
import collections
from types import SimpleNamespace

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LatencyHistogram:
    __slots__ = ("counts", "sum")

    def __init__(self):
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.sum += seconds

    def buckets(self):
        out, acc = [], 0
        for bound, n in zip(LATENCY_BUCKETS_S + (float("inf"),), self.counts):
            acc += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), acc))
        return out


class PutTopic:
    """One topic's send figures, reached by ONE lookup per message (Metrics.put_topics): the
    messages and body bytes stored since the last fold into put_msgs / put_bytes, and its
    latency histograms, the very objects in put_latency under (topic, False) and (topic,
    True), None until first observed. At thousands of topics a probe of each of several
    tables would be a cache miss per message."""
    __slots__ = ("batch", "bytes", "msgs", "single")

    def __init__(self) -> None:
        self.msgs = self.bytes = 0
        self.single: LatencyHistogram | None = None
        self.batch: LatencyHistogram | None = None


# Why a request was answered SYSTEM_BUSY (node/remoting/server.py, node/remoting/connection.py, pull.py).
BUSY_REASONS = ("connections", "inflight", "held_pulls", "partial_frames")


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=False)
        self.put_msgs = collections.Counter()    # topic -> messages stored
        self.put_bytes = collections.Counter()   # topic -> body bytes stored
        self.get_msgs = collections.Counter()    # topic -> messages served by pulls
        self.get_bytes = collections.Counter()   # topic -> record bytes served
        self.requests = collections.Counter()    # request code name -> requests handled
        # reason -> SYSTEM_BUSY replies; every reason is exported from the start, at 0, so a
        # rate() or increase() over it has data before the first rejection
        self.busy = collections.Counter(dict.fromkeys(BUSY_REASONS, 0))
        # consumer group -> messages sent back (node/processors/send_back.py); groups are
        # bounded by max_topics: a copy is stored only once %RETRY%/%DLQ%<group> exists
        self.retried = collections.Counter()
        self.dead_lettered = collections.Counter()
        self.protocol_errors = 0
        self.slow_consumer_cutoffs = 0
        self.flush_timeouts = 0
        self.duplicates_suppressed = 0  # sends answered from the dedup window (node/sending/dedup.py)
        self.latency = collections.defaultdict(LatencyHistogram)  # request kind -> histogram
        # Sends and pulls by topic; the kind histograms (send, send_batch, pull) are summed
        # from these at scrape time, so the hot path observes ONE histogram per request.
        self.put_latency = collections.defaultdict(LatencyHistogram)  # (topic, batch) -> hist
        # topic -> PutTopic: the send path's counts, folded into put_msgs / put_bytes before
        # anything reads those (fold_puts), and its put_latency histograms
        self.put_topics: dict[str, PutTopic] = {}
        self.get_latency = collections.defaultdict(LatencyHistogram)  # topic -> hist
        self.flush_slave_timeouts = 0
        self.hold_wait = LatencyHistogram()
        self.gauges = {}  # name -> (help, fn() -> float)
        self.put_total = 0
        self.get_total = 0
        self.registry.register(_Collector(self))
        self._others: list = []  # every collector after _Collector, in registration order
        # process_* (CPU, RSS, fds) and python_* from prometheus_client's own collectors.
        for c in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.add_collector(c)

    def put_topic(self, topic: str) -> PutTopic:
        """`topic`'s PutTopic, made on first use."""
        rec = self.put_topics.get(topic)
        if rec is None:
            rec = self.put_topics[topic] = PutTopic()
        return rec

    def put_hist(self, rec: PutTopic, topic: str, batch: bool) -> LatencyHistogram:
        """put_latency[(topic, batch)], remembered in `topic`'s PutTopic `rec`."""
        hist = self.put_latency[(topic, batch)]
        if batch:
            rec.batch = hist
        else:
            rec.single = hist
        return hist

    def fold_puts(self) -> None:
        """Move the send path's per-topic counts into put_msgs and put_bytes (on the loop
        thread, the only one that changes them; before every read of those tables)."""
        put_msgs, put_bytes = self.put_msgs, self.put_bytes
        for topic, rec in self.put_topics.items():
            if rec.msgs:
                put_msgs[topic] += rec.msgs
                put_bytes[topic] += rec.bytes
                rec.msgs = rec.bytes = 0

    def gauge(self, name: str, help_text: str, fn) -> None:
        self.gauges[name] = (help_text, fn)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def render_off_loop(self) -> bytes:
        """render()'s text without stalling the loop for it: on the loop thread (the only one
        that changes them) the hot-path tables are copied and the other collectors read; the
        families of the copy (one histogram per topic: seconds at thousands of topics) are
        built and formatted in the loop's default executor, reading only the copy."""
        copy = _snapshot(self)
        others = [f for c in self._others for f in c.collect()]
        return await asyncio.get_running_loop().run_in_executor(None, _render_copy, copy, others)

    def add_collector(self, collector) -> None:
        """Another block's collector (node/ops/scrape.py: store, consumer lag, cluster)."""
        self.registry.register(collector)
        self._others.append(collector)

    def forget_topic(self, topic: str) -> None:
        """Drop a deleted topic's series (labels stay bounded by the topic table)."""
        for table in (self.put_msgs, self.put_bytes, self.get_msgs, self.get_bytes,
                      self.get_latency):
            table.pop(topic, None)
        for key in [k for k in self.put_latency if k[0] == topic]:
            del self.put_latency[key]
        self.put_topics.pop(topic, None)

    def add_ha(self, replication) -> None:
        """Replication metrics (see HACollector below)."""
        self.add_collector(HACollector(replication))


class _Collector:
    def __init__(self, m: Metrics):
        self.m = m

    def collect(self):
        self.m.fold_puts()
        return _families(self.m, [(n, h, fn()) for n, (h, fn) in self.m.gauges.items()])


def _families(m, gauges: list):
    """The hot-path tables' families: `m` is the Metrics or a _snapshot of it, `gauges`
    (name, help, value) triples."""
    yield _by_label("tidemq_messages_put", "Messages stored, by topic.", "topic", m.put_msgs)
    yield _by_label("tidemq_message_put_body_bytes", "Message body bytes stored, by topic.",
                    "topic", m.put_bytes)
    yield _by_label("tidemq_messages_get", "Messages served to pulls, by topic.", "topic",
                    m.get_msgs)
    yield _by_label("tidemq_message_get_bytes", "Record bytes served to pulls, by topic.",
                    "topic", m.get_bytes)
    yield _by_label("tidemq_requests", "Requests handled, by request code.", "code",
                    m.requests)
    yield _by_label("tidemq_system_busy_rejections", "Requests answered SYSTEM_BUSY, by "
                    "reason.", "reason", m.busy)
    for name, help_text, value in (
            ("tidemq_protocol_errors", "Connections closed for bad frames.", m.protocol_errors),
            ("tidemq_slow_consumer_cutoffs", "Connections cut off for not reading replies.",
             m.slow_consumer_cutoffs),
            ("tidemq_flush_disk_timeouts", "Sends answered FLUSH_DISK_TIMEOUT.",
             m.flush_timeouts),
            ("tidemq_flush_slave_timeouts", "Sends answered FLUSH_SLAVE_TIMEOUT.",
             m.flush_slave_timeouts),
            ("tidemq_duplicates_suppressed", "Messages answered from the duplicate window, "
             "not stored again.", m.duplicates_suppressed)):
        c = CounterMetricFamily(name, help_text)
        c.add_metric([], value)
        yield c
    h = HistogramMetricFamily("tidemq_request_latency_seconds", "Time from a request's "
                              "arrival to its reply, by kind.", labels=["kind"])
    kinds = dict(m.latency)
    kinds["send"] = _merged(v for (_, b), v in m.put_latency.items() if not b)
    kinds["send_batch"] = _merged(v for (_, b), v in m.put_latency.items() if b)
    kinds["pull"] = _merged(m.get_latency.values())
    for kind, hist in sorted(kinds.items()):
        h.add_metric([kind], hist.buckets(), hist.sum)
    yield h
    by_topic = collections.defaultdict(list)
    for (topic, _), hist in m.put_latency.items():
        by_topic[topic].append(hist)
    h = HistogramMetricFamily("tidemq_put_latency_seconds", "Send arrival to reply (fsync "
                              "and replication waits included), by topic.", labels=["topic"])
    for topic, hists in sorted(by_topic.items()):
        hist = _merged(hists)
        h.add_metric([topic], hist.buckets(), hist.sum)
    yield h
    h = HistogramMetricFamily("tidemq_get_latency_seconds", "Pull arrival to reply for "
                              "pulls answered at once, by topic.", labels=["topic"])
    for topic, hist in sorted(m.get_latency.items()):
        h.add_metric([topic], hist.buckets(), hist.sum)
    yield h
    h = HistogramMetricFamily("tidemq_pull_hold_seconds", "How long held pulls waited.")
    h.add_metric([], m.hold_wait.buckets(), m.hold_wait.sum)
    yield h
    for name, help_text, value in gauges:
        g = GaugeMetricFamily(name, help_text)
        g.add_metric([], float(value))
        yield g


def _snapshot(m: Metrics) -> SimpleNamespace:
    """Copies of the tables _families reads, taken on the loop thread."""
    m.fold_puts()
    out = SimpleNamespace()
    for name in ("put_msgs", "put_bytes", "get_msgs", "get_bytes", "requests", "busy"):
        setattr(out, name, dict(getattr(m, name)))
    for name in ("protocol_errors", "slow_consumer_cutoffs", "flush_timeouts",
                 "flush_slave_timeouts", "duplicates_suppressed"):
        setattr(out, name, getattr(m, name))
    for name in ("latency", "put_latency", "get_latency"):
        setattr(out, name, {k: _copied(h) for k, h in getattr(m, name).items()})
    out.hold_wait = _copied(m.hold_wait)
    out.gauges = [(n, h, fn()) for n, (h, fn) in m.gauges.items()]
    return out


def _copied(h: LatencyHistogram) -> LatencyHistogram:
    out = LatencyHistogram()
    out.counts, out.sum = h.counts[:], h.sum
    return out


class _Families:
    """Families ready for the formatter, in the registry's order."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return self.families


def _render_copy(copy: SimpleNamespace, others: list) -> bytes:
    return generate_latest(_Families(list(_families(copy, copy.gauges)) + others))


def _merged(hists) -> LatencyHistogram:
    out = LatencyHistogram()
    for h in hists:
        out.counts = [a + b for a, b in zip(out.counts, h.counts)]
        out.sum += h.sum
    return out


def _by_label(name: str, help_text: str, label: str, values) -> CounterMetricFamily:
    c = CounterMetricFamily(name, help_text, labels=[label])
    for key, value in sorted(values.items()):
        c.add_metric([str(key)], value)
    return c


# -- replication -----------------------------------------------------------------------------
HA_ROLES = ("MASTER", "SLAVE", "FENCED", "NONE")


class HACollector:
    """Role, epoch, confirmed offset, in-sync set size and, on a master, each slave's acked
    offset and lag (bytes, seconds); on a slave its own acked offset and lag. Label values are
    slave node ids: bounded by the group's size."""

    def __init__(self, replication):
        self.r = replication

    def collect(self):
        m = self.r.metrics()
        g = GaugeMetricFamily("tidemq_ha_role", "1 for this node's replication role.",
                              labels=["role"])
        for role in HA_ROLES:
            g.add_metric([role], 1.0 if m["role"] == role else 0.0)
        yield g
        for name, help_text, value in (
                ("tidemq_ha_epoch", "Epoch this node leads or follows.", m["epoch"]),
                ("tidemq_ha_confirmed_offset_bytes", "Confirmed (consumer-visible, replicated) "
                 "commit-log offset.", m["confirmed_offset"]),
                ("tidemq_ha_in_sync_replicas", "In-sync set size, the master included (0 when "
                 "not master).", m["in_sync_size"]),
                ("tidemq_ha_acked_offset_bytes", "Slave: offset acknowledged to the master.",
                 m["acked_offset"]),
                ("tidemq_ha_lag_bytes", "Slave: bytes the master holds beyond this node.",
                 m["lag_bytes"])):
            g = GaugeMetricFamily(name, help_text)
            g.add_metric([], float(value))
            yield g
        slaves = m["slaves"]
        for key, name, help_text in (
                ("acked_offset", "tidemq_ha_slave_acked_offset_bytes", "Master: each slave's "
                 "acknowledged offset."),
                ("lag_bytes", "tidemq_ha_slave_lag_bytes", "Master: bytes each slave is behind."),
                ("lag_seconds", "tidemq_ha_slave_lag_seconds", "Master: how long each slave has "
                 "not been caught up."),
                ("in_sync", "tidemq_ha_slave_in_sync", "Master: 1 when the slave is in sync."),
                ("connected", "tidemq_ha_slave_connected", "Master: 1 when the slave is "
                 "connected.")):
            g = GaugeMetricFamily(name, help_text, labels=["slave"])
            for node, st in sorted(slaves.items()):
                g.add_metric([node], float(st[key]))
            yield g
