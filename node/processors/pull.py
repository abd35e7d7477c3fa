"""PULL_MESSAGE (11), with long polling (docs/protocol.md, Pull; RocketMQ's PullMessageProcessor).

Store status -> response code (PullMessageProcessor):
  FOUND -> 0 (only ever with a non-empty body); NO_MATCHED_MESSAGE -> 20; OFFSET_FOUND_NULL,
  OFFSET_OVERFLOW_ONE -> 19; OFFSET_TOO_SMALL, OFFSET_OVERFLOW_BADLY -> 21;
  NO_MESSAGE_IN_QUEUE / NO_MATCHED_LOGIC_QUEUE -> 19 at offset 0, else 21 (next = 0).
Every reply carries ext suggestWhichBrokerId, nextBeginOffset, minOffset, maxOffset; the next
offset is exact on 19/20 (cpp commits it when idle).

Rules:
1. Only pulls with the SUSPEND sysflag are held, and only when the answer would be 19; held
   up to min(suspendTimeoutMillis, max_pull_suspend_ms) (short_polling_ms with long polling
   off). A message arriving for the queue wakes the pull at once (node/consumers/long_polling.py).
2. Filter: TAG expressions by tag hash code ("tagA || tagB", "*" = all), SQL92 expressions
   (expressionType "SQL92") on record properties (node/filter). The expression comes
   from the request when the SUBSCRIPTION flag is set, else from the group's heartbeat, else
   from the request's `subscription` field, else "*" (more lenient than Java's
   SUBSCRIPTION_NOT_EXIST). Clients re-filter by exact tag string. A bad SQL92 expression or
   an unknown type is answered 23 SUBSCRIPTION_PARSE_FAILED; a SQL92 one with
   enable_property_filter off 1 SYSTEM_ERROR "The broker does not support consumer to filter
   message by SQL92" (RocketMQ's remark).
3. COMMIT_OFFSET piggyback: commitOffset is stored for (group, topic, queue) before the read.
4. A reply holds at most min(maxMsgNums, pull_max_msgs) records and pull_max_bytes bytes.
5. Records carry this broker's advertised address as STOREHOST (node/processors/store_host.py).
6. Replication: a slave serves what is confirmed (the store dispatches no further) and ignores
   piggybacked commits (offsets come from the master's replicated state); a master whose log
   end is far ahead of what a pull reads suggests an in-sync slave (suggestWhichBrokerId).
7. Group settings (200; node/consumers/group_settings_table.py): a group with consumeEnable
   false is answered 16 NO_PERMISSION "subscription group no permission, <group>"; one with
   consumeBroadcastEnable false whose consumers registered BROADCASTING is answered 16 "the
   consumer group[<group>] can not consume by broadcast way" (RocketMQ's remarks).
"""
from __future__ import annotations

import time

from tidemq.node import filter as message_filter
from tidemq.node.consumers.offset_table import OffsetTableFull
from tidemq.node.filter import FilterDisabled, FilterError
from tidemq.node.processors.common import error, subscription_codes, topic_not_exist_remark
from tidemq.node.processors.store_host import join_records
from tidemq.node.remoting.server import DEFERRED
from tidemq.node.store.reader import GetStatus
from tidemq.node.topics import RETRY_PREFIX, group_name_ok
from tidemq.protocol.codes import PermName, PullSysFlag, ResponseCode
from tidemq.protocol.remoting import RemotingCommand

_S = GetStatus
_CODES = {_S.FOUND: 0, _S.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
          _S.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
          _S.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
          _S.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
          _S.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
          _S.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED}
_EMPTY = (_S.NO_MESSAGE_IN_QUEUE, _S.NO_MATCHED_LOGIC_QUEUE)
_READ = int(PermName.READ)
_SUSPEND = int(PullSysFlag.SUSPEND)
_COMMIT = int(PullSysFlag.COMMIT_OFFSET)
_SUBSCRIPTION = int(PullSysFlag.SUBSCRIPTION)


class PullProcessor:
    def __init__(self, cfg, store, topics, offsets, clients, groups, metrics, hold, *,
                 store_host: bytes, replication=None, reset_fence=None):
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.clients = clients
        self.groups = groups
        self.metrics = metrics
        self.hold = hold
        self.hold.execute = self._execute_held
        self.store_host = store_host
        self.replication = replication  # None when this node does not replicate
        self.reset_fence = reset_fence
        self.max_msgs = cfg.pull_max_msgs
        self.max_bytes = cfg.pull_max_bytes
        self.long_polling = cfg.long_polling_enable
        self.short_polling_s = cfg.short_polling_ms / 1000
        self.max_suspend_s = cfg.max_pull_suspend_ms / 1000
        self.sql92_enabled = cfg.enable_property_filter

    def __call__(self, conn, cmd: RemotingCommand, req):
        t0 = time.perf_counter()
        group, topic, queue_id = req.group, req.topic, req.queue_id
        offset, max_nums, sys_flag = req.queue_offset, req.max_msgs, req.sys_flag
        refusal = self.groups.pull_refusal(group, self.clients.message_model(group))
        if refusal is not None:  # rule 7
            return error(cmd, ResponseCode.NO_PERMISSION, refusal)
        problem = self.queue_problem(topic, queue_id, conn.peer)
        if problem is not None:
            return error(cmd, *problem)
        try:
            if sys_flag & _SUBSCRIPTION:
                codes, predicate = self.build_filter(req.expression_type, req.subscription)
            else:
                codes, predicate = self.filter_for(group, topic, req.subscription,
                                                   req.expression_type)
        except FilterError as exc:
            return error(cmd, *filter_refusal(exc))
        if sys_flag & _COMMIT:
            self.piggyback_commit(conn, group, topic, queue_id, req.commit_offset)
        if self.reset_fence is not None:  # a pull at the reset offset: the reset was handled
            self.reset_fence.saw_pull(conn, group, topic, queue_id, offset)
        limit = max(1, min(max_nums, self.max_msgs))
        args = (codes, limit, offset, predicate)  # the third: the offset the pull asked for
        res, code = self.read(topic, queue_id, offset, args)
        if code == ResponseCode.PULL_NOT_FOUND and sys_flag & _SUSPEND:
            timeout_s = self.hold_s(req.suspend_ms)
            if timeout_s > 0:
                if self.hold.hold(conn, cmd, topic, queue_id, offset, args, timeout_s):
                    return DEFERRED
                self.metrics.busy["held_pulls"] += 1
                return error(cmd, ResponseCode.SYSTEM_BUSY,
                             "[OVERLOAD]system busy, too many held pulls")
        response = self._respond(cmd, topic, res, code)
        self.metrics.get_latency[topic].observe(time.perf_counter() - t0)
        return response

    def hold_s(self, suspend_ms: int) -> float:
        """How long a pull that found nothing waits (rule 1)."""
        if self.long_polling:
            return min(max(suspend_ms, 0) / 1000, self.max_suspend_s)
        return self.short_polling_s

    def queue_problem(self, topic: str, queue_id: int, peer) -> tuple[int, str] | None:
        """(code, remark) when the queue may not be pulled, else None."""
        tc = self.topics.table.get(topic)
        if tc is None and topic.startswith(RETRY_PREFIX):
            tc = self.topics.create_in_send(topic, None, 1)
        if tc is None:
            return ResponseCode.TOPIC_NOT_EXIST, topic_not_exist_remark(topic)
        if not tc.perm & _READ:
            return ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden"
        if not 0 <= queue_id < tc.read_queue_nums:
            return (ResponseCode.SYSTEM_ERROR,
                    f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                    f"topicConfig.readQueueNums:[{tc.read_queue_nums}] consumer:[{peer}]")
        return None

    def piggyback_commit(self, conn, group: str, topic: str, queue_id: int, commit: int) -> None:
        """Rule 3 (and rule 6: a slave ignores it)."""
        if self.replication is not None and not self.replication.is_master:
            return
        fence = self.reset_fence
        if commit >= 0 and fence is not None and \
                not fence.allow_commit(conn, group, topic, queue_id, commit):
            return  # older than an offset reset this client has not handled yet
        if commit >= 0 and group_name_ok(group):
            try:
                self.offsets.commit(group, topic, queue_id, commit)
            except OffsetTableFull:
                pass  # the pull itself still works; an explicit commit gets the error

    def filter_for(self, group: str, topic: str, expression, expression_type):
        """(tag codes, SQL92 predicate or None): the group's registered subscription of the
        topic, else the given expression (rule 2). FilterError when it does not parse."""
        sub = self.clients.subscription(group, topic)
        if sub is not None:
            if (sub.expression_type or "TAG").upper() == "TAG":
                return subscription_codes(sub), None
            return self.build_filter(sub.expression_type, sub.sub_string)
        return self.build_filter(expression_type, expression)

    def build_filter(self, expression_type, expression):
        """node/filter's build under this broker's enable_property_filter (rule 2)."""
        return message_filter.build(expression_type, expression, sql92_enabled=self.sql92_enabled)

    def _execute_held(self, held, final: bool):
        """The hold service's re-execution (longpoll rule 4)."""
        res, code = self.read(held.topic, held.queue_id, held.offset, held.args)
        if not final:
            if code == ResponseCode.PULL_RETRY_IMMEDIATELY and res.next_begin_offset > held.offset:
                held.offset = res.next_begin_offset  # skip what the filter rejected
            if code != 0 and code != ResponseCode.PULL_OFFSET_MOVED:
                return None  # keep holding
        elif code == ResponseCode.PULL_NOT_FOUND and held.offset > held.args[2]:
            code = ResponseCode.PULL_RETRY_IMMEDIATELY  # messages were passed over by the filter
        return self._respond(held.request, held.topic, res, code)

    def read(self, topic, queue_id, offset, args, max_bytes: int | None = None):
        codes, limit, _, predicate = args  # the third: the offset the pull asked for
        res = self.store.get_messages(topic, queue_id, offset, limit,
                                      self.max_bytes if max_bytes is None else max_bytes, codes)
        status = res.status
        if predicate is not None and status == _S.FOUND:
            res.messages = message_filter.keep_matching(res.messages, predicate)
            if not res.messages:
                status = res.status = _S.NO_MATCHED_MESSAGE
        code: int
        if status in _EMPTY:
            code = ResponseCode.PULL_NOT_FOUND if offset == 0 else ResponseCode.PULL_OFFSET_MOVED
        else:
            code = _CODES[status]
        return res, code

    def _respond(self, cmd, topic, res, code):
        ext = {"suggestWhichBrokerId": "0", "nextBeginOffset": str(res.next_begin_offset),
               "minOffset": str(res.min_offset), "maxOffset": str(res.max_offset)}
        if code == 0:
            body, suggest = self.records(topic, res)
            ext["suggestWhichBrokerId"] = str(suggest)
            return RemotingCommand.make_response(cmd, 0, ext, body)
        return RemotingCommand.make_response(cmd, int(code), ext)

    def records(self, topic: str, res) -> tuple[bytes, int]:
        """A FOUND read's records as sent (rule 5, counted in the metrics) and the broker id
        to suggest (rule 6)."""
        suggest = 0
        if self.replication is not None:
            suggest = self.replication.suggest_broker_id(res.max_phys_offset)
        msgs = res.messages
        body = join_records(msgs, self.store_host)
        m = self.metrics
        m.get_total += len(msgs)
        m.get_msgs[topic] += len(msgs)
        m.get_bytes[topic] += len(body)
        return body, suggest


def filter_refusal(exc: FilterError) -> tuple[int, str]:
    """(code, remark) answering a subscription the broker will not evaluate (rule 2)."""
    if isinstance(exc, FilterDisabled):
        return ResponseCode.SYSTEM_ERROR, str(exc)
    return ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc)
