"""Shared helpers for store tests: small-file configs and deterministic messages."""
import hashlib

from tidemq.node.store.config import StoreConfig
from tidemq.node.store.message import StoreMessage

SMALL = dict(commitlog_file_bytes=64 * 1024, max_message_bytes=16 * 1024,
             consume_queue_file_units=64, index_slots=101, index_entries=400)


def small_config(root, **overrides) -> StoreConfig:
    return StoreConfig(root_dir=str(root), **{**SMALL, **overrides})


def payload(seq: int, size: int) -> bytes:
    seed = hashlib.sha256(str(seq).encode()).digest()
    return (seed * (size // 32 + 1))[:size]


def message(seq: int, size: int = 100, topic: str = "T", queues: int = 4) -> StoreMessage:
    return StoreMessage(topic, seq % queues, payload(seq, size),
                        {"TAGS": f"tag{seq % 3}", "KEYS": f"k{seq} shared",
                         "UNIQ_KEY": f"U{seq:012d}"})


def crash(store) -> None:
    """Stop a store the way SIGKILL would as far as the files go: no checkpoint, no clean
    flag (the abort file stays), page-cache contents kept. Only for in-process tests."""
    store.writable = False
    store.maintenance.stop()
    store.flush_service.stop()
    store.commit_log.close()
    store.queues.abandon()  # a killed process never commits its open transaction
    if store.index is not None:
        store.index.close()
    store.checkpoint.close()
    store.write_mark.close()
    store._release_lock()
