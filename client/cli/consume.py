"""`tidemq consume`: read a topic as a consumer group, or peek at it without committing.

    tidemq consume TOPIC GROUP [--count N] [--timeout S] [--from-beginning] [--print]
    tidemq consume TOPIC --peek [--queue Q [--offset O]] [--count N] [--print]
    tidemq consume TOPIC GROUP --follow --print          until Ctrl-C, as messages arrive

Rules:
1. Exactly `--count` messages at most are delivered, printed and committed: a pull that
   returns more is cut, and the queue's offset moves only past what was delivered.
2. Start offsets: `--offset` (with `--queue`); else the group's committed offset; else the
   queue's first message with `--from-beginning`, its end without. `--peek` never commits and
   starts at the committed offset of GROUP when given, else at the first message.
3. Commits (UPDATE_CONSUMER_OFFSET) happen once a second and at the end, also after Ctrl-C
   (exit 0 with --follow, where Ctrl-C is the way to stop, else 130), for what was delivered;
   a closed stdout (`| head`) stops at once, commits only what was
   written, and exits 141 without a traceback.
4. Exit code 3 when `--count` was given and fewer arrived before `--timeout`.
5. The tool pulls every queue itself (it does not join the group's rebalance): do not run it
   on a group whose consumers are running, except with `--peek`, which pulls under a group
   of its own (it only reads GROUP's committed offsets), so GROUP's members never see it.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from argparse import ArgumentParser, Namespace
from typing import TYPE_CHECKING, Any

from tidemq.cli import errors as cli_errors
from tidemq.cli.output import Progress, resolve

if TYPE_CHECKING:
    from argparse import _SubParsersAction

    from tidemq.cli.main import Common
    from tidemq.consumer.pull import PullConsumer
    from tidemq.message import MessageExt
    from tidemq.topic_routes import MessageQueue

PEEK_GROUP = "tidemq-cli-peek"
PULL_MAX = 32
IDLE_SLEEP_S = 0.2
COMMIT_EVERY_S = 1.0


def add_parser(sub: _SubParsersAction[ArgumentParser], common: type[Common]) -> None:
    p = sub.add_parser("consume", help="read messages as a consumer group (or --peek without "
                       "committing) and print the count and throughput", **common.fmt)
    p.add_argument("topic", help="topic to read")
    p.add_argument("group", nargs="?", help="consumer group whose offsets are used and committed "
                   "(optional with --peek)")
    p.add_argument("--count", type=int, default=0, help="stop after exactly N messages (0 = no limit)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="stop after S seconds (0 = no limit); ignored with --follow")
    p.add_argument("--follow", action="store_true", help="keep reading new messages until Ctrl-C")
    p.add_argument("--peek", action="store_true", help="look only: never commit offsets")
    p.add_argument("--from-beginning", action="store_true",
                   help="a group without committed offsets starts at the first message (default: "
                   "at the end, only new messages)")
    p.add_argument("--queue", type=int, help="read only this queue id")
    p.add_argument("--broker-group", help="with --queue: only this broker group's queue")
    p.add_argument("--offset", type=int, help="with --queue: start at this queue offset")
    p.add_argument("--tag", default="*", help="tag expression, e.g. 'a || b'")
    p.add_argument("--print", action="store_true",
                   help="print each message (a JSON line, or a text line on a terminal)")
    p.add_argument("--body-chars", type=int, default=200, help="body characters printed per message")
    common.add(p)


def check(args: Namespace) -> None:
    if not args.group and not args.peek:
        raise ValueError("consume needs a GROUP (or --peek to look without committing)")
    if args.count < 0 or args.timeout < 0:
        raise ValueError("--count and --timeout must be >= 0")
    if (args.offset is not None or args.broker_group) and args.queue is None:
        raise ValueError("--offset and --broker-group need --queue")


class _Reader:
    """Per-queue offsets, delivery and commits (rules 1-3)."""

    def __init__(self, pc: PullConsumer, args: Namespace) -> None:
        self.pc, self.args = pc, args
        self.next: dict[MessageQueue, int] = {}          # mq -> next offset to read
        self.committed: dict[MessageQueue, int] = {}     # mq -> offset last committed
        self.received = 0
        self.first_at: float | None = None
        self.text = resolve(args.output) == "table"

    async def start_offsets(self, queues: list[MessageQueue]) -> None:
        a = self.args
        for mq in queues:
            if a.offset is not None:
                self.next[mq] = a.offset
                continue
            stored = await self._committed(mq) if a.group else -1
            if stored >= 0:
                self.next[mq] = stored
            elif a.from_beginning or a.peek:
                self.next[mq] = await self.pc.min_offset(mq)
            else:
                self.next[mq] = await self.pc.max_offset(mq)
            self.committed[mq] = stored

    async def _committed(self, mq: MessageQueue) -> int:
        """GROUP's committed offset; under --peek read as PEEK_GROUP's guest (rule 5)."""
        if not self.args.peek:
            return await self.pc.committed(mq)
        from tidemq.consumer import broker_calls as pull_api
        return await pull_api.query_consumer_offset(self.pc._running(), self.pc._addr(mq),
                                                    self.args.group, mq)

    def wanted(self, queues_left: int) -> int:
        """With --count, the rest is spread over the queues still to visit in this round, so
        a short read takes from every queue instead of draining the first."""
        if not self.args.count:
            return PULL_MAX
        rest: int = self.args.count - self.received
        return min(PULL_MAX, -(-rest // max(queues_left, 1)))

    async def pull_round(self) -> int:
        """One pull per queue; the number of messages delivered."""
        from tidemq.consumer.broker_calls import PullStatus
        got = 0
        queues = list(self.next)
        for i, mq in enumerate(queues):
            want = self.wanted(len(queues) - i)
            if want <= 0:
                break
            result = await self.pc.pull(mq, self.next[mq], want, expression=self.args.tag)
            if result.status is PullStatus.OFFSET_ILLEGAL:
                self.next[mq] = max(result.next_begin_offset, 0)
                continue
            if result.status is not PullStatus.FOUND:
                if result.next_begin_offset > self.next[mq]:   # filtered by tag: skip them
                    self.next[mq] = result.next_begin_offset
                continue
            msgs = result.messages[:want]
            for m in msgs:
                self.deliver(m)
                self.next[mq] = m.queue_offset + 1
            if len(msgs) == len(result.messages):
                self.next[mq] = max(self.next[mq], result.next_begin_offset)
            got += len(msgs)
        return got

    def deliver(self, m: MessageExt) -> None:
        """Print (a BrokenPipeError propagates before the offset moves: rule 3)."""
        if self.args.print:
            line = _text_line(m, self.args.body_chars) if self.text else \
                json.dumps(describe(m, self.args.body_chars), sort_keys=True)
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        if self.first_at is None:
            self.first_at = time.perf_counter()
        self.received += 1

    async def commit(self) -> None:
        if self.args.peek or not self.args.group:
            return
        for mq, offset in self.next.items():
            if self.committed.get(mq) != offset and offset >= 0:
                await self.pc.commit(mq, offset)
                self.committed[mq] = offset


async def run(args: Namespace) -> tuple[dict[str, Any], int]:
    from tidemq.consumer.pull import PullConsumer
    check(args)
    group = PEEK_GROUP if args.peek else args.group
    start = time.perf_counter()
    pc = PullConsumer(group, args.broker)
    await pc.start()
    reader = _Reader(pc, args)
    progress = Progress(f"consume {args.topic}")
    rc = cli_errors.EXIT_OK
    try:
        queues = [mq for mq in await pc.fetch_queues(args.topic, args.tag)
                  if args.queue is None or (mq.queue_id == args.queue and
                                            args.broker_group in (None, mq.broker_name))]
        if not queues:
            raise ValueError(f"topic {args.topic!r} has no queue {args.queue}"
                             + (f" on {args.broker_group}" if args.broker_group else ""))
        await reader.start_offsets(queues)
        rc = await _loop(reader, args, progress, start)
    except BrokenPipeError:
        _silence_stdout()
        rc = cli_errors.EXIT_PIPE
    finally:
        progress.clear()
        try:
            await reader.commit()
        finally:
            await pc.shutdown()
    end = time.perf_counter()
    active = end - (reader.first_at or end)
    result = {"topic": args.topic, "group": args.group, "received": reader.received,
              "requested": args.count or None, "committed": not args.peek and bool(args.group),
              "seconds": round(end - start, 3),
              "msgs_s": round(reader.received / active, 1) if active > 0 else 0.0}
    if rc == cli_errors.EXIT_OK and args.count and reader.received < args.count:
        print(f"tidemq: received {reader.received} of {args.count} messages before the "
              f"{args.timeout:g} s timeout", file=sys.stderr)
        rc = cli_errors.EXIT_INCOMPLETE
    return result, rc


async def _loop(reader: _Reader, args: Namespace, progress: Progress, start: float) -> int:
    deadline = None if args.follow or not args.timeout else start + args.timeout
    last_commit = time.perf_counter()
    try:
        while not (args.count and reader.received >= args.count):
            if deadline is not None and time.perf_counter() >= deadline:
                break
            got = await reader.pull_round()
            progress.tick(reader.received, args.count or None)
            if time.perf_counter() - last_commit >= COMMIT_EVERY_S:
                await reader.commit()
                last_commit = time.perf_counter()
            if not got:
                pause = IDLE_SLEEP_S if deadline is None else \
                    max(0.0, min(IDLE_SLEEP_S, deadline - time.perf_counter()))
                await asyncio.sleep(pause)
    except asyncio.CancelledError:   # Ctrl-C: the normal end of --follow
        return cli_errors.EXIT_OK if args.follow else cli_errors.EXIT_INTERRUPTED
    return cli_errors.EXIT_OK


def _silence_stdout() -> None:
    """After EPIPE, later flushes (at exit) must not raise again."""
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def describe(m: MessageExt, body_chars: int = 1000) -> dict[str, Any]:
    body = m.body
    return {"topic": m.topic, "broker": getattr(m, "broker_name", None), "queue_id": m.queue_id,
            "queue_offset": m.queue_offset, "msg_id": m.msg_id, "offset_msg_id": m.offset_msg_id,
            "tags": m.tags, "keys": m.keys, "store_timestamp": m.store_timestamp,
            "body_bytes": len(body), "body": body[:body_chars].decode("utf-8", "replace")}


def _text_line(m: MessageExt, body_chars: int) -> str:
    body = m.body[:body_chars].decode("utf-8", "replace").replace("\n", "\\n")
    return f"{m.queue_id}:{m.queue_offset} {m.msg_id or '-'} tags={m.tags or '-'} {body}"
