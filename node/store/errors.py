"""Store outcomes and errors.

PutStatus mirrors RocketMQ's PutMessageStatus where the broker maps it onto a wire code; the
operating errors are typed so callers can answer with a clear message and change nothing.
"""
from __future__ import annotations

import enum


class PutStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"      # stored, not confirmed durable
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"    # stored, not confirmed by replicas
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"


class StoreError(Exception):
    """Base class of store operating errors; `retriable` tells a client whether to try again."""

    retriable = False


class MessageIllegal(StoreError):
    """Bad input (size, topic name, properties, queue id): nothing was written."""


class DiskFull(StoreError):
    """Disk use is above the warning ratio: writes are refused until retention frees space."""

    retriable = True


class StoreClosed(StoreError):
    """The store is shut down (or fenced) and accepts no writes."""

    retriable = True


class QueueUnavailable(StoreClosed):
    """A consume queue the put needs cannot be opened (file descriptors, I/O): nothing was
    written. A StoreClosed, so every writer answers it as the retriable refusal it is."""


class StoreLocked(StoreError):
    """Another process holds the store's lock file."""


class StoreCorrupt(StoreError):
    """The store cannot be opened as it is (wrong file sizes, unknown version)."""


class OffsetMismatch(StoreError):
    """A raw append did not start at the log's end (replication must resynchronise)."""
