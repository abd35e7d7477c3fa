"""Numbers of the RocketMQ 4.x remoting protocol: request, response, language and flag codes.

Every number here is RocketMQ 4.9's: request and response codes from `RequestCode.java` and
`ResponseCode.java`, the serialize type and flag bits from `RemotingCommand.java`, language codes
from `LanguageCode.java`, perm bits from `PermName.java`, pull sys flags from `PullSysFlag.java`
(docs/protocol.md lists the ones the broker uses).

Invariants:
1. Names are the Java names (`RequestCode.java`, `ResponseCode.java`), so a grep for a
   Java constant finds ours.
2. Request and response codes overlap numerically (10 is SEND_MESSAGE and FLUSH_DISK_TIMEOUT);
   `RemotingCommand.code` is a plain int and the flag bit says which table applies.
3. This module imports nothing of ours.
"""

from enum import IntEnum, IntFlag


class RequestCode(IntEnum):
    # send and consume
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    UPDATE_AND_CREATE_TOPIC_LIST = 18
    GET_ALL_TOPIC_CONFIG = 21
    # broker and queue info
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    # clients and transactions
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    CHECK_CLIENT_CONFIG = 46  # can this broker evaluate a subscription (SQL92 filters)
    # name server
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105  # cpp spells it GET_ROUTEINTO_BY_TOPIC
    GET_BROKER_CLUSTER_INFO = 106
    # admin (mqadmin)
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    GET_KVLIST_BY_NAMESPACE = 219
    GET_TOPICS_BY_CLUSTER = 224
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_UNIT_TOPIC_LIST = 311
    GET_HAS_UNIT_SUB_TOPIC_LIST = 312
    GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST = 313
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    # broker -> client
    RESET_CONSUMER_CLIENT_OFFSET = 220
    GET_CONSUMER_STATUS_FROM_CLIENT = 221
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    # newer sends and config
    SEND_MESSAGE_V2 = 310
    UPDATE_NAMESRV_CONFIG = 318
    SEND_BATCH_MESSAGE = 320
    QUERY_DATA_VERSION = 322
    # TideMQ's own (no Java client sends it; Java has no code 9001)
    GET_PARKED_TRANSACTIONS = 9001  # `tidemq txn parked` (node/processors/transaction.py)
    BATCH_PULL_MESSAGE = 9002  # one long poll over many queues (node/processors/batch_pull.py)
    # many queues' consumer offsets in one request (node/processors/consumer_offsets.py)
    UPDATE_CONSUMER_OFFSET_BATCH = 9003


class ResponseCode(IntEnum):
    # system
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    # store and permissions
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    # pull and query
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    # subscription and filter
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    # transactions and consumers
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202  # sic: the Java spelling
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    # ACL and flow control
    UPDATE_AND_CREATE_ACL_CONFIG_FAILED = 209
    DELETE_ACL_CONFIG_FAILED = 210
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED = 211
    FLOW_CONTROL = 215
    ILLEGAL_OPERATION = 604  # END after a half message's check immunity (EndTransactionProcessor)


class LanguageCode(IntEnum):
    """Sent as the enum NAME in JSON headers and as an i8 in ROCKETMQ headers."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class SerializeType(IntEnum):
    """High byte of the frame's second word."""

    JSON = 0
    ROCKETMQ = 1


# RemotingCommand.flag bits. A Java response's flag is exactly FLAG_RESPONSE.
FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2

# Client MQVersion ordinals (`MQVersion.java`) that change server behaviour.
VERSION_V3_1_8 = 63  # what cpp 1.2.4 sends
VERSION_V3_4_9 = 121  # from here the send header's maxReconsumeTimes is honoured (retry sends)
VERSION_V4_9_4 = 401  # from here the Java name server emits standard (quoted-key) route JSON
VERSION_V4_9_8 = 409


class PullSysFlag(IntFlag):
    """PULL_MESSAGE header `sysFlag` bits (`PullSysFlag.java`)."""

    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8
    LITE_PULL = 0x10


class PermName(IntFlag):
    """Topic / queue permission bits (`PermName.java`). Normal = READ|WRITE."""

    INHERIT = 1
    WRITE = 2
    READ = 4
    PRIORITY = 8


PERM_READ_WRITE = PermName.READ | PermName.WRITE  # 6, what a normal topic carries
