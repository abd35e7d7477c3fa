"""The work a pure HA session hands back to its caller (etcd-raft's Ready, in small pieces).

EXECUTION RULE: run a returned list in order; each action finishes (durably, where marked)
before the next starts. Two freedoms: an executor may hold back a Flush and the ACK that
follows it and run them at the end of the batch of frames it is processing, in that order
(group acknowledgement); and it may run the batch's last SetConfirmed after that ACK (it only
makes records visible later, never earlier). Nothing else may be reordered.

Slave-side orderings the sessions rely on (each is written where the list is built):
1. Truncate / ResetLog  ->  SaveEpochs  ->  (Flush)  ->  ACK: a cut is durable, then the epoch
   history forgets what was cut, and only then is anything acknowledged.
2. SaveEpochs  ->  AppendRaw: the new epoch's entry is durable before its first byte lands.
3. AppendRaw  ->  (Flush when the slave acks after flush)  ->  ACK.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SendFrame:
    frame: object
    conn: object = None          # master side: which connection; slave side: None


@dataclass(frozen=True)
class Drop:
    """Close the connection. `refused`: the peer refused us (do not hammer it)."""
    reason: str
    conn: object = None
    refused: bool = False


@dataclass(frozen=True)
class Truncate:
    """Durably cut the log (and consume queues and index) back to `offset`. Emitted on every
    accepted handshake, also when offset == max offset (a no-op cut that re-anchors the
    store's parse position)."""
    offset: int


@dataclass(frozen=True)
class ResetLog:
    """Discard the whole log; it restarts empty at `offset` (the slave shares nothing the
    master still holds, e.g. the master's retention deleted the consistent point)."""
    offset: int


@dataclass(frozen=True)
class SaveEpochs:
    """Durably write the epoch history (atomic file write) before the next action."""
    entries: tuple


@dataclass(frozen=True)
class AppendRaw:
    offset: int
    data: bytes = field(repr=False)


@dataclass(frozen=True)
class Flush:
    """fsync the commit log (store.flush_log(0))."""


@dataclass(frozen=True)
class SetConfirmed:
    """Move the consumer-visible bound (store.set_confirmed_offset); never backwards."""
    offset: int


@dataclass(frozen=True)
class Fenced:
    """The master saw a newer epoch: it must stop accepting writes now."""
    epoch: int
