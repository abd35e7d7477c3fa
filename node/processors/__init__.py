"""Request processors, one module per concern, and the table that wires them to codes.

Implemented: 10/310/320 send, 36 send-back, 11 pull, 12/33 query, 14/15 consumer offsets, 17/21 topics,
28 runtime info, 29/30/31/32 queue offsets and times, 34/35/38 clients, 37 end transaction,
41/42 queue locks, 46 client filter checks, 105 route, 208 consume stats, 9001 parked
transactions, 9002 batched pulls and 9003 offset batches (TideMQ's own),
operator codes 202/207/215/222 (ops.py), 200/201 group settings (subscription_groups.py).
Everything else (including 25 and 318, refused on purpose) is answered
3 REQUEST_CODE_NOT_SUPPORTED by the server.

Every code here has a row in the request table (node/requests/table.py) and vice versa (a
missing row fails start-up here; tests/edges/test_request_table.py checks both ways). The
server parses the frame with that row; a processor is `fn(conn, cmd, req)` and reads the
typed request `req`, never `cmd.ext`.
"""
from __future__ import annotations

from tidemq.node.processors import connections, subscription_groups
from tidemq.node.processors.admin import AdminProcessor
from tidemq.node.processors.batch_pull import BatchPullProcessor
from tidemq.node.processors.check_client import check_client_config
from tidemq.node.processors.client_manage import ClientManageProcessor
from tidemq.node.processors.consume_stats import ConsumeStatsProcessor
from tidemq.node.processors.consumer_offsets import OffsetProcessor
from tidemq.node.processors.ops import OpsProcessor
from tidemq.node.processors.pull import PullProcessor
from tidemq.node.processors.query import QueryProcessor
from tidemq.node.processors.route_query import RouteProcessor
from tidemq.node.processors.send import SendProcessor
from tidemq.node.processors.send_back import SendBackProcessor
from tidemq.node.processors.transaction import EndTransactionProcessor, parked_transactions
from tidemq.node.requests import PARSERS
from tidemq.protocol.codes import RequestCode as R


def register_all(server, broker) -> ClientManageProcessor:
    """Wire every processor to its code on `server`. Each processor gets the broker's
    components it uses."""
    b = broker
    send = SendProcessor(b.cfg, store=b.store, topics=b.topics, metrics=b.metrics, loop=b.loop,
                         bridge=b.bridge, role=b.role, replication=b.replication,
                         schedule=b.schedule, transactions=b.transactions,
                         store_host=b.store_host)
    pull = PullProcessor(b.cfg, b.store, b.topics, b.offsets, b.clients, b.groups, b.metrics,
                         b.hold, store_host=b.store_host, replication=b.replication,
                         reset_fence=b.reset_fence)
    offsets = OffsetProcessor(b.store, b.offsets, b.replication, b.reset_fence)
    clients = ClientManageProcessor(b.clients, b.topics, b.loop)
    admin = AdminProcessor(b.cfg, b.store, b.topics, b.metrics, b.locks, hold=b.hold,
                           connections=server.connections, replication=b.replication,
                           role=b.role, loop=b.loop)
    query = QueryProcessor(b.store, b.store_host, b.cfg.query_max_msgs)
    send_back = SendBackProcessor(b.store, b.topics, b.groups, b.schedule, b.metrics,
                                  b.store_host, send)
    table = {
        R.SEND_MESSAGE: send, R.SEND_MESSAGE_V2: send, R.SEND_BATCH_MESSAGE: send,
        R.PULL_MESSAGE: pull, R.CONSUMER_SEND_MSG_BACK: send_back,
        R.QUERY_MESSAGE: query.query_message, R.VIEW_MESSAGE_BY_ID: query.view_message,
        R.QUERY_CONSUMER_OFFSET: offsets.query_consumer_offset,
        R.UPDATE_CONSUMER_OFFSET: offsets.update_consumer_offset,
        R.UPDATE_CONSUMER_OFFSET_BATCH: offsets.update_consumer_offset_batch,
        R.SEARCH_OFFSET_BY_TIMESTAMP: offsets.offset_by_time,
        R.GET_MAX_OFFSET: offsets.max_offset, R.GET_MIN_OFFSET: offsets.min_offset,
        R.GET_EARLIEST_MSG_STORETIME: offsets.earliest_time,
        R.UPDATE_AND_CREATE_TOPIC: admin.create_topic,
        R.UPDATE_AND_CREATE_TOPIC_LIST: admin.create_topic_list,
        R.GET_ALL_TOPIC_CONFIG: admin.all_topics,
        R.GET_BROKER_RUNTIME_INFO: admin.runtime_info,
        R.LOCK_BATCH_MQ: admin.lock_batch, R.UNLOCK_BATCH_MQ: admin.unlock_batch,
        R.HEART_BEAT: clients.heartbeat, R.UNREGISTER_CLIENT: clients.unregister,
        R.GET_CONSUMER_LIST_BY_GROUP: clients.consumer_list,
        R.CHECK_CLIENT_CONFIG: check_client_config(b.cfg.enable_property_filter),
        R.GET_ROUTEINFO_BY_TOPIC: RouteProcessor(b.routing),
        R.END_TRANSACTION: EndTransactionProcessor(b.role, b.transactions, b.schedule,
                                                   b.cfg.broker_name),
        R.GET_CONSUME_STATS: ConsumeStatsProcessor(b.store, b.topics, b.offsets, b.clients,
                                                   b.cfg.broker_name, server.acl),
        R.GET_PARKED_TRANSACTIONS: parked_transactions(b.store, b.store_host),
    }
    if b.cfg.batch_pull_enable:  # off: answered 3, as by a broker without it
        table[R.BATCH_PULL_MESSAGE] = BatchPullProcessor(pull, b.hold, b.groups, b.clients, b.cfg)
    connections.register(server, b.clients)   # 203/204 (node/processors/connections.py)
    subscription_groups.register(server, b.groups, b.offsets, b.clients, b.topics,
                                 b.replication)   # 200/201 (node/processors/subscription_groups.py)
    ops = OpsProcessor(b.cfg.broker_name, b.store, b.topics, b.offsets, b.groups, b.clients,
                       b.metrics, reset_fence=b.reset_fence, replication=b.replication,
                       replicated_state=b.replicated_state)
    table.update({R.GET_TOPIC_STATS_INFO: ops.topic_stats, R.INVOKE_BROKER_TO_RESET_OFFSET:
                  ops.reset_offset, R.DELETE_SUBSCRIPTIONGROUP: ops.delete_group,
                  R.DELETE_TOPIC_IN_BROKER: ops.delete_topic})
    for code, fn in table.items():
        server.register(code, fn, PARSERS[int(code)])  # KeyError: a code without a table row
    return clients
