"""Checkpoint: durable watermarks, in offsets, that tell recovery where to start.

RocketMQ's StoreCheckpoint.java records store timestamps and derives a start file from them,
which depends on clocks and on message order; TideMQ records commit-log offsets directly.
4 KiB file, big-endian (docs/store-format.md, Checkpoint):

    @0  magic u32 'TMCK'   @4 version u32 = 1
    @8  flushed_offset i64       commit log durable below this
    @16 dispatched_offset i64    consume queues and key index durable below this
    @24 confirmed_offset i64     consumer-visible bound last persisted (HA)
    @32 crc u32                  crc32 of bytes [0, 32)

A checkpoint whose CRC does not match is treated as absent: recovery then scans from the log
head, which is slow but never wrong.
"""
from __future__ import annotations

import os
import struct
import zlib

_BODY = struct.Struct(">IIqqq")
_CRC = struct.Struct(">I")
MAGIC = 0x544D434B
SIZE = 4096


class Checkpoint:
    def __init__(self, fs, root_dir: str):
        path = os.path.join(root_dir, "checkpoint")
        existed = os.path.exists(path) and os.path.getsize(path) == SIZE
        self._mapping = fs.map_file(path, SIZE)
        self.valid = False
        self.flushed_offset = self.dispatched_offset = self.confirmed_offset = 0
        if existed:
            self._read()

    def _read(self) -> None:
        buf = self._mapping.buf
        magic, version, flushed, dispatched, confirmed = _BODY.unpack_from(buf, 0)
        if magic == MAGIC and version == 1 and \
                _CRC.unpack_from(buf, _BODY.size)[0] == zlib.crc32(buf[:_BODY.size]):
            self.flushed_offset, self.dispatched_offset = flushed, dispatched
            self.confirmed_offset = confirmed
            self.valid = True

    def save(self, flushed: int, dispatched: int, confirmed: int) -> None:
        buf = self._mapping.buf
        _BODY.pack_into(buf, 0, MAGIC, 1, flushed, dispatched, confirmed)
        _CRC.pack_into(buf, _BODY.size, zlib.crc32(buf[:_BODY.size]))
        self._mapping.sync()
        self.flushed_offset, self.dispatched_offset = flushed, dispatched
        self.confirmed_offset = confirmed
        self.valid = True

    def close(self) -> None:
        self._mapping.close()
