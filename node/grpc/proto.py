"""TideMQ's own protobuf definitions of the RocketMQ 5 gRPC messaging protocol
(package apache.rocketmq.v2), built at import time into a private descriptor pool.

The schema below is written from the protocol's wire facts (message names, field numbers and
types); it declares only what the broker reads or writes. Fields it does not declare survive
as unknown fields and cost nothing. No protoc and no generated code: `SCHEMA` is parsed by
the small reader below into a FileDescriptorProto, so the broker depends on protobuf and
grpcio only, never on a client SDK's package (the RocketMQ 4 and 5 Python SDKs both install
a top-level `rocketmq`).

Schema syntax: `enum N { A = 0; ... }`, `message N { [repeated|optional] type name = num;
map<k, v> name = num; oneof o { type name = num; } }`, one declaration per line.
"""
from __future__ import annotations

import re

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    message_factory,
    timestamp_pb2,
)

PACKAGE = "apache.rocketmq.v2"
SERVICE = f"{PACKAGE}.MessagingService"

SCHEMA = """
enum TransactionResolution { TRANSACTION_RESOLUTION_UNSPECIFIED = 0; COMMIT = 1; ROLLBACK = 2; }
enum TransactionSource { SOURCE_UNSPECIFIED = 0; SOURCE_CLIENT = 1; SOURCE_SERVER_CHECK = 2; }
enum Permission { PERMISSION_UNSPECIFIED = 0; NONE = 1; READ = 2; WRITE = 3; READ_WRITE = 4; }
enum FilterType { FILTER_TYPE_UNSPECIFIED = 0; TAG = 1; SQL = 2; }
enum AddressScheme { ADDRESS_SCHEME_UNSPECIFIED = 0; IPv4 = 1; IPv6 = 2; DOMAIN_NAME = 3; }
enum MessageType { MESSAGE_TYPE_UNSPECIFIED = 0; NORMAL = 1; FIFO = 2; DELAY = 3; TRANSACTION = 4; }
enum DigestType { DIGEST_TYPE_UNSPECIFIED = 0; CRC32 = 1; MD5 = 2; SHA1 = 3; }
enum ClientType { CLIENT_TYPE_UNSPECIFIED = 0; PRODUCER = 1; PUSH_CONSUMER = 2; SIMPLE_CONSUMER = 3; PULL_CONSUMER = 4; }
enum Encoding { ENCODING_UNSPECIFIED = 0; IDENTITY = 1; GZIP = 2; }
message FilterExpression {
  FilterType type = 1;
  string expression = 2;
}
message ExponentialBackoff {
  google.protobuf.Duration initial = 1;
  google.protobuf.Duration max = 2;
  float multiplier = 3;
}
message CustomizedBackoff {
  repeated google.protobuf.Duration next = 1;
}
message RetryPolicy {
  int32 max_attempts = 1;
  oneof strategy {
    ExponentialBackoff exponential_backoff = 2;
    CustomizedBackoff customized_backoff = 3;
  }
}
message Resource {
  string resource_namespace = 1;
  string name = 2;
}
message SubscriptionEntry {
  Resource topic = 1;
  FilterExpression expression = 2;
}
message Address {
  string host = 1;
  int32 port = 2;
}
message Endpoints {
  AddressScheme scheme = 1;
  repeated Address addresses = 2;
}
message Broker {
  string name = 1;
  int32 id = 2;
  Endpoints endpoints = 3;
}
message MessageQueue {
  Resource topic = 1;
  int32 id = 2;
  Permission permission = 3;
  Broker broker = 4;
  repeated MessageType accept_message_types = 5;
}
message Digest {
  DigestType type = 1;
  string checksum = 2;
}
message DeadLetterQueue {
  string topic = 1;
  string message_id = 2;
}
message SystemProperties {
  optional string tag = 1;
  repeated string keys = 2;
  string message_id = 3;
  Digest body_digest = 4;
  Encoding body_encoding = 5;
  MessageType message_type = 6;
  google.protobuf.Timestamp born_timestamp = 7;
  string born_host = 8;
  optional google.protobuf.Timestamp store_timestamp = 9;
  string store_host = 10;
  optional google.protobuf.Timestamp delivery_timestamp = 11;
  optional string receipt_handle = 12;
  int32 queue_id = 13;
  optional int64 queue_offset = 14;
  optional google.protobuf.Duration invisible_duration = 15;
  optional int32 delivery_attempt = 16;
  optional string message_group = 17;
  optional string trace_context = 18;
  optional google.protobuf.Duration orphaned_transaction_recovery_duration = 19;
  optional DeadLetterQueue dead_letter_queue = 20;
}
message Message {
  Resource topic = 1;
  map<string, string> user_properties = 2;
  SystemProperties system_properties = 3;
  bytes body = 4;
}
message Assignment {
  MessageQueue message_queue = 1;
}
message Status {
  int32 code = 1;
  string message = 2;
}
message UA {
  int32 language = 1;
  string version = 2;
  string platform = 3;
  string hostname = 4;
}
message Publishing {
  repeated Resource topics = 1;
  int32 max_body_size = 2;
  bool validate_message_type = 3;
}
message Subscription {
  optional Resource group = 1;
  repeated SubscriptionEntry subscriptions = 2;
  optional bool fifo = 3;
  optional int32 receive_batch_size = 4;
  optional google.protobuf.Duration long_polling_timeout = 5;
}
message Metric {
  bool on = 1;
  optional Endpoints endpoints = 2;
}
message Settings {
  optional ClientType client_type = 1;
  optional Endpoints access_point = 2;
  optional RetryPolicy backoff_policy = 3;
  optional google.protobuf.Duration request_timeout = 4;
  oneof pub_sub {
    Publishing publishing = 5;
    Subscription subscription = 6;
  }
  UA user_agent = 7;
  Metric metric = 8;
}
message QueryRouteRequest {
  Resource topic = 1;
  Endpoints endpoints = 2;
}
message QueryRouteResponse {
  Status status = 1;
  repeated MessageQueue message_queues = 2;
}
message SendMessageRequest {
  repeated Message messages = 1;
}
message SendResultEntry {
  Status status = 1;
  string message_id = 2;
  string transaction_id = 3;
  int64 offset = 4;
}
message SendMessageResponse {
  Status status = 1;
  repeated SendResultEntry entries = 2;
}
message QueryAssignmentRequest {
  Resource topic = 1;
  Resource group = 2;
  Endpoints endpoints = 3;
}
message QueryAssignmentResponse {
  Status status = 1;
  repeated Assignment assignments = 2;
}
message ReceiveMessageRequest {
  Resource group = 1;
  MessageQueue message_queue = 2;
  FilterExpression filter_expression = 3;
  int32 batch_size = 4;
  optional google.protobuf.Duration invisible_duration = 5;
  bool auto_renew = 6;
  optional google.protobuf.Duration long_polling_timeout = 7;
  optional string attempt_id = 8;
}
message ReceiveMessageResponse {
  oneof content {
    Status status = 1;
    Message message = 2;
    google.protobuf.Timestamp delivery_timestamp = 3;
  }
}
message AckMessageEntry {
  string message_id = 1;
  string receipt_handle = 2;
}
message AckMessageRequest {
  Resource group = 1;
  Resource topic = 2;
  repeated AckMessageEntry entries = 3;
}
message AckMessageResultEntry {
  string message_id = 1;
  string receipt_handle = 2;
  Status status = 3;
}
message AckMessageResponse {
  Status status = 1;
  repeated AckMessageResultEntry entries = 2;
}
message ForwardMessageToDeadLetterQueueRequest {
  Resource group = 1;
  Resource topic = 2;
  string receipt_handle = 3;
  string message_id = 4;
  int32 delivery_attempt = 5;
  int32 max_delivery_attempts = 6;
}
message ForwardMessageToDeadLetterQueueResponse {
  Status status = 1;
}
message HeartbeatRequest {
  optional Resource group = 1;
  ClientType client_type = 2;
}
message HeartbeatResponse {
  Status status = 1;
}
message EndTransactionRequest {
  Resource topic = 1;
  string message_id = 2;
  string transaction_id = 3;
  TransactionResolution resolution = 4;
  TransactionSource source = 5;
  string trace_context = 6;
}
message EndTransactionResponse {
  Status status = 1;
}
message RecoverOrphanedTransactionCommand {
  Message message = 1;
  string transaction_id = 2;
}
message TelemetryCommand {
  optional Status status = 1;
  oneof command {
    Settings settings = 2;
    RecoverOrphanedTransactionCommand recover_orphaned_transaction_command = 5;
  }
}
message NotifyClientTerminationRequest {
  optional Resource group = 1;
}
message NotifyClientTerminationResponse {
  Status status = 1;
}
message ChangeInvisibleDurationRequest {
  Resource group = 1;
  Resource topic = 2;
  string receipt_handle = 3;
  google.protobuf.Duration invisible_duration = 4;
  string message_id = 5;
}
message ChangeInvisibleDurationResponse {
  Status status = 1;
  string receipt_handle = 2;
}
"""

_SCALARS = {name: getattr(descriptor_pb2.FieldDescriptorProto, "TYPE_" + name.upper())
            for name in ("double", "float", "int64", "uint64", "int32", "bool", "string",
                         "bytes", "uint32", "sint32", "sint64", "fixed32", "fixed64")}
_FIELD = re.compile(r"^(?:(repeated|optional) )?(map<\s*(\w+),\s*(\w+)>|[\w.]+) (\w+) = (\d+);$")
_F = descriptor_pb2.FieldDescriptorProto


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_"))


def _set_type(field, type_name: str, enums: set) -> None:
    if type_name in _SCALARS:
        field.type = _SCALARS[type_name]
    elif type_name in enums:
        field.type, field.type_name = _F.TYPE_ENUM, f".{PACKAGE}.{type_name}"
    else:
        field.type = _F.TYPE_MESSAGE
        field.type_name = "." + type_name if type_name.startswith("google.") \
            else f".{PACKAGE}.{type_name}"


def _add_field(msg, line: str, enums: set, oneof_index, optionals: list) -> None:
    m = _FIELD.match(line)
    if m is None:
        raise ValueError(f"bad schema line: {line!r}")
    label, type_name, key_t, value_t, name, number = m.groups()
    f = msg.field.add(name=name, number=int(number), json_name=name)
    f.label = _F.LABEL_REPEATED if label == "repeated" or key_t else _F.LABEL_OPTIONAL
    if key_t:  # a map is a repeated nested entry message
        entry = msg.nested_type.add(name=_camel(name) + "Entry")
        entry.options.map_entry = True
        _set_type(entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL), key_t, enums)
        _set_type(entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL), value_t, enums)
        f.type, f.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{msg.name}.{entry.name}"
        return
    _set_type(f, type_name, enums)
    if oneof_index is not None:
        f.oneof_index = oneof_index
    elif label == "optional":  # proto3 optional: a synthetic oneof, added after real ones
        f.proto3_optional = True
        optionals.append(f)


def build_file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="tidemq/rocketmq_v2.proto", package=PACKAGE,
                                            syntax="proto3")
    fd.dependency.extend(["google/protobuf/timestamp.proto", "google/protobuf/duration.proto"])
    enums = set(re.findall(r"^enum (\w+)", SCHEMA, re.MULTILINE))
    msg, oneof, optionals = None, None, []
    for line in (x.strip() for x in SCHEMA.splitlines()):
        if not line:
            continue
        if line.startswith("enum "):
            name, body = re.match(r"enum (\w+) \{(.*)\}$", line).groups()
            e = fd.enum_type.add(name=name)
            for value_name, number in re.findall(r"(\w+) = (\d+);", body):
                e.value.add(name=value_name, number=int(number))
        elif line.startswith("message "):
            msg = fd.message_type.add(name=line.split()[1])
        elif line.startswith("oneof "):
            oneof = len(msg.oneof_decl)
            msg.oneof_decl.add(name=line.split()[1])
        elif line == "}":
            if oneof is not None:
                oneof = None
                continue
            for f in optionals:
                f.oneof_index = len(msg.oneof_decl)
                msg.oneof_decl.add(name="_" + f.name)
            msg, optionals = None, []
        else:
            _add_field(msg, line, enums, oneof, optionals)
    return fd


def _load():
    pool = descriptor_pool.DescriptorPool()
    for dep in (timestamp_pb2, duration_pb2):
        pool.AddSerializedFile(dep.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(build_file().SerializeToString())
    names = re.findall(r"^(?:message|enum) (\w+)", SCHEMA, re.MULTILINE)
    out = {}
    for name in names:
        full = f"{PACKAGE}.{name}"
        try:
            out[name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(full))
        except KeyError:
            out[name] = pool.FindEnumTypeByName(full)
    return out


_TYPES = _load()
globals().update(_TYPES)


class Code:
    """apache.rocketmq.v2.Code values the broker answers with."""
    OK = 20000
    MULTIPLE_RESULTS = 30000
    BAD_REQUEST = 40000
    ILLEGAL_TOPIC = 40002
    ILLEGAL_CONSUMER_GROUP = 40003
    ILLEGAL_MESSAGE_GROUP = 40006
    INVALID_TRANSACTION_ID = 40008
    ILLEGAL_FILTER_EXPRESSION = 40010
    ILLEGAL_INVISIBLE_TIME = 40011
    ILLEGAL_DELIVERY_TIME = 40012
    INVALID_RECEIPT_HANDLE = 40013
    CLIENT_ID_REQUIRED = 40017
    UNAUTHORIZED = 40100
    FORBIDDEN = 40300
    NOT_FOUND = 40400
    MESSAGE_NOT_FOUND = 40401
    TOPIC_NOT_FOUND = 40402
    PAYLOAD_TOO_LARGE = 41300
    MESSAGE_BODY_TOO_LARGE = 41301
    MESSAGE_BODY_EMPTY = 41302
    TOO_MANY_REQUESTS = 42900
    INTERNAL_ERROR = 50000
    HA_NOT_AVAILABLE = 50002
    NOT_IMPLEMENTED = 50100


def enum_value(enum_name: str, value_name: str) -> int:
    return _TYPES[enum_name].values_by_name[value_name].number
