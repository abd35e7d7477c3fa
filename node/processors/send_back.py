"""CONSUMER_SEND_MSG_BACK (36): a consumer hands back a message it failed to consume
(RocketMQ's SendMessageProcessor.asyncConsumerSendMsgBack).

ext: group, offset (the record's commit-log position), delayLevel (cpp: a JSON number),
optional originMsgId, originTopic, maxReconsumeTimes (honoured from clients >= V3_4_9).

Steps: find the record at `offset` (1 "look message by offset failed, <n>" if none starts
there); copy it with RETRY_TOPIC = its original topic (if absent), ORIGIN_MESSAGE_ID = the
record's own ORIGIN_MESSAGE_ID, else the record's offset message id (so every retry and
dead-letter copy names the first message, however often it came back; the request's
originMsgId is not trusted: node/system_properties.py), and reconsumeTimes + 1; store the
copy in %DLQ%<group> when reconsumeTimes >= max or delayLevel < 0, else in
%RETRY%<group>; answer 0 once stored. `max` is the request's maxReconsumeTimes when the client
sends one (>= V3_4_9, as Java), else the group's retryMaxTimes (200; the broker's
max_reconsume_times for a group without stored settings).

The retry copy waits in SCHEDULE_TOPIC_XXXX (node/sending/schedule.py) for delay level delayLevel,
or 3 + reconsumeTimes when the client sent 0 (Java: 10 s first, growing to the last level), so
a message that keeps failing reaches the DLQ after max_reconsume_times growing delays (about
4 hours with the default levels). The dead-letter copy is stored at once. cpp consumers commit
the offset of a failed message anyway, so storing the copy is what keeps it from being lost.
"""
from __future__ import annotations

import struct
import time

from tidemq.node.processors.common import error
from tidemq.node.store.message import PROP_DELIVER_AT_MS, SCHEDULE_TOPIC, StoreMessage
from tidemq.node.system_properties import PROP_ORIGIN_MESSAGE_ID, PROP_RETRY_TOPIC
from tidemq.node.topics import DLQ_PREFIX, RETRY_PREFIX
from tidemq.protocol import record as rec
from tidemq.protocol.codes import VERSION_V3_4_9, ResponseCode
from tidemq.protocol.remoting import RemotingCommand

_SCHEDULE_PROPS = (rec.PROP_REAL_TOPIC, rec.PROP_REAL_QID, rec.PROP_DELAY, PROP_DELIVER_AT_MS)
_I64 = struct.Struct(">q")


class SendBackProcessor:
    def __init__(self, store, topics, groups, schedule, metrics, store_host: bytes, send):
        self.store = store
        self.topics = topics
        self.groups = groups  # the group settings (retryMaxTimes)
        self.schedule = schedule
        self.metrics = metrics
        self.store_host = store_host
        self.send = send

    def __call__(self, conn, cmd, req):
        group, offset, delay_level = req.group, req.offset, req.delay_level
        max_times = req.max_reconsume_times
        if max_times is None or cmd.version < VERSION_V3_4_9:
            max_times = self.groups.retry_max_times(group)
        data = self.store.get_record(offset) if offset >= 0 else b""
        if not data or len(data) < 36 or _I64.unpack_from(data, rec.POS_PHYSICAL_OFFSET)[0] != offset:
            return error(cmd, ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        m = rec.decode_record(data)
        props = rec.decode_properties(rec.strip_crc_property(m.properties_raw))
        origin = props.get(rec.PROP_REAL_TOPIC) or m.topic
        for name in _SCHEDULE_PROPS:  # sent back while still a schedule entry: drop its routing
            props.pop(name, None)
        props.setdefault(PROP_RETRY_TOPIC, origin)
        props[PROP_ORIGIN_MESSAGE_ID] = props.get(PROP_ORIGIN_MESSAGE_ID) or m.offset_msg_id
        dead = m.reconsume_times >= max_times or delay_level < 0
        tc = self.topics.ensure_group_topic((DLQ_PREFIX if dead else RETRY_PREFIX) + group)
        if tc is None:
            return error(cmd, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                         f"subscription group not exist, {group}")
        topic, queue_id = tc.name, 0
        if not dead:  # wait the delay level first (see the module docstring)
            level = delay_level if delay_level > 0 else 3 + m.reconsume_times
            queue_id, props = self.schedule.wrap_level(tc.name, 0, props, level,
                                                       int(time.time() * 1000))
            topic = SCHEDULE_TOPIC
        copy = StoreMessage(topic, queue_id, m.body, props, flag=m.flag,
                            sys_flag=m.sys_flag & ~(rec.SYSFLAG_BORNHOST_V6 | rec.SYSFLAG_STOREHOST_V6),
                            born_timestamp=m.born_timestamp, born_host=m.born_host,
                            store_host=self.store_host,
                            reconsume_times=m.reconsume_times + 1)
        counts = self.metrics.dead_lettered if dead else self.metrics.retried

        def answer(code):
            # Java answers SUCCESS whenever the copy is stored, FLUSH_DISK_TIMEOUT included.
            stored = code in (0, ResponseCode.FLUSH_DISK_TIMEOUT)
            if stored:
                counts[group] += 1
            return RemotingCommand.make_response(cmd, 0 if stored else int(code))
        return self.send.submit(conn, cmd, [copy], answer)
