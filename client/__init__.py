"""TideMQ: a replicated, RocketMQ-compatible message broker, and its Python SDK.

    from tidemq import Producer, PushConsumer, Message, ConsumeResult, MessageSelector

The SDK is this package (standard library only, so Spark workers and small services can
install it alone); the broker and its parts live in subpackages:

| package | what |
|---|---|
| tidemq.protocol | the wire: remoting frames, codes, the CommitLog v1 record layout (pure) |
| tidemq.producer | producers: single, async, oneway, batch, ordered, transactional |
| tidemq.consumer | push (concurrent, orderly) and pull consumers, allocation, offsets, retries |
| tidemq.admin, tidemq.cli | operator calls and the `tidemq` command line |
| tidemq.node | the broker process (store, processors, replication glue, metrics) |
| tidemq.ha | replication between a master and its slaves (pure sessions + asyncio edge) |
| tidemq.coordinator | cluster mode over ZooKeeper: election, epochs, routes |
| tidemq.pipeline | the PySpark data source and sink |

Names below are imported on first use (PEP 562), so `import tidemq.protocol` in the broker
does not load the whole SDK.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Producer": "tidemq.producer.producer",
    "SendResult": "tidemq.producer.producer",
    "SendStatus": "tidemq.producer.producer",
    "TransactionProducer": "tidemq.producer.transactional",
    "TransactionState": "tidemq.producer.transactional",
    "TransactionSendResult": "tidemq.producer.transactional",
    "PushConsumer": "tidemq.consumer.push",
    "ConsumeResult": "tidemq.consumer.push",
    "OrderlyPushConsumer": "tidemq.consumer.orderly",
    "PullConsumer": "tidemq.consumer.pull",
    "PullResult": "tidemq.consumer.broker_calls",
    "PullStatus": "tidemq.consumer.broker_calls",
    "MessageSelector": "tidemq.consumer.selector",
    "Message": "tidemq.message",
    "MessageExt": "tidemq.message",
    "ProducerConfig": "tidemq.config",
    "ConsumerConfig": "tidemq.config",
    "MessageModel": "tidemq.config",
    "ConsumeFrom": "tidemq.config",
    "ClientSecurity": "tidemq.security",
    "Admin": "tidemq.admin",
    "SyncProducer": "tidemq.sync",
    "SyncPushConsumer": "tidemq.sync",
    "SyncOrderlyPushConsumer": "tidemq.sync",
    "SyncPullConsumer": "tidemq.sync",
    "TideMQError": "tidemq.errors",
}
__all__ = [
    "Admin",
    "ClientSecurity",
    "ConsumeFrom",
    "ConsumeResult",
    "ConsumerConfig",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageSelector",
    "OrderlyPushConsumer",
    "Producer",
    "ProducerConfig",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "SendResult",
    "SendStatus",
    "SyncOrderlyPushConsumer",
    "SyncProducer",
    "SyncPullConsumer",
    "SyncPushConsumer",
    "TideMQError",
    "TransactionProducer",
    "TransactionSendResult",
    "TransactionState",
]

if TYPE_CHECKING:
    from tidemq.admin import Admin
    from tidemq.config import ConsumeFrom, ConsumerConfig, MessageModel, ProducerConfig
    from tidemq.consumer.broker_calls import PullResult, PullStatus
    from tidemq.consumer.orderly import OrderlyPushConsumer
    from tidemq.consumer.pull import PullConsumer
    from tidemq.consumer.push import ConsumeResult, PushConsumer
    from tidemq.consumer.selector import MessageSelector
    from tidemq.errors import TideMQError
    from tidemq.message import Message, MessageExt
    from tidemq.producer.producer import Producer, SendResult, SendStatus
    from tidemq.producer.transactional import TransactionProducer, TransactionSendResult, TransactionState
    from tidemq.security import ClientSecurity
    from tidemq.sync import SyncOrderlyPushConsumer, SyncProducer, SyncPullConsumer, SyncPushConsumer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tidemq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
