"""`tidemq produce`: send messages with a body you choose, or generated ones for a load test.

    tidemq produce TOPIC --body TEXT [--count N]     N copies of TEXT (default 1)
    tidemq produce TOPIC --body-file PATH [--count N] the file's bytes as the body
    tidemq produce TOPIC --stdin                     one message per line of stdin
    tidemq produce TOPIC --count N --size B          N generated bodies of B bytes (load test)

Rules:
1. Sends run `--in-flight` at a time (batches of `--batch` when > 1); results are counted as
   sent (acknowledged), maybe_stored (no answer: do not count it acknowledged) or failed.
2. The exit code is 0 only when every message was acknowledged; otherwise 3, and stderr names
   the first failure with a hint (client/cli/errors.py).
3. Stdin lines keep their bytes (no decoding); the line break is not part of the body; empty
   lines are skipped (a message needs a body).
"""
from __future__ import annotations

import asyncio
import sys
import time
from argparse import ArgumentParser, Namespace
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from tidemq.cli import errors as cli_errors
from tidemq.cli.output import Progress

if TYPE_CHECKING:
    from argparse import _SubParsersAction

    from tidemq.cli.main import Common
    from tidemq.producer.producer import SendResult

T = TypeVar("T")


def add_parser(sub: _SubParsersAction[ArgumentParser], common: type[Common]) -> None:
    p = sub.add_parser("produce", help="send messages (a body you give, a file, stdin lines, or "
                       "generated load) and print the counts and throughput", **common.fmt)
    p.add_argument("topic", help="topic to send to")
    body = p.add_mutually_exclusive_group()
    body.add_argument("--body", help="message body text (UTF-8)")
    body.add_argument("--body-file", metavar="PATH", help="send this file's bytes as the body")
    body.add_argument("--stdin", action="store_true", help="send each line of stdin as a message")
    p.add_argument("--count", type=int, help="messages to send (default: 1 with --body or "
                   "--body-file, 1000 generated ones otherwise; not with --stdin)")
    p.add_argument("--size", type=int, default=1024, help="bytes of each generated body")
    p.add_argument("--batch", type=int, default=1, help="messages per batch send")
    p.add_argument("--tag", help="tag of every message")
    p.add_argument("--key", help="key of every message (for `message query --key`)")
    p.add_argument("--group", default="tidemq-cli-producer", help="producer group")
    p.add_argument("--in-flight", type=int, default=256, help="sends in flight at once")
    common.add(p)


def bodies(args: Namespace) -> list[bytes]:
    """The bodies to send, in order (rule 3)."""
    if args.stdin:
        if args.count is not None:
            raise ValueError("--count does not go with --stdin (one message per line)")
        return [line.rstrip(b"\r\n") for line in sys.stdin.buffer if line.rstrip(b"\r\n")]
    count = args.count if args.count is not None else (1 if args.body or args.body_file else 1000)
    if count <= 0:
        raise ValueError("--count must be positive")
    if args.body is not None:
        if not args.body:
            raise ValueError("--body is empty (a message needs a body)")
        return [args.body.encode()] * count
    if args.body_file:
        try:
            with open(args.body_file, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ValueError(f"cannot read --body-file: {exc.strerror}: {args.body_file}") from None
        if not data:
            raise ValueError(f"--body-file {args.body_file} is empty (a message needs a body)")
        return [data] * count
    if args.size <= 0:
        raise ValueError("--size must be positive")
    return [(b"tidemq-" * (args.size // 7 + 1))[:args.size]] * count


async def run(args: Namespace) -> tuple[dict[str, Any], int]:
    from tidemq.message import Message
    from tidemq.producer.producer import Producer
    if args.batch <= 0 or args.in_flight <= 0:
        raise ValueError("--batch and --in-flight must be positive")
    payloads = bodies(args)
    if not payloads:
        raise ValueError("nothing to send (stdin had no lines)")
    chunks = [payloads[i:i + args.batch] for i in range(0, len(payloads), args.batch)]
    window = args.in_flight if args.batch == 1 else max(args.in_flight // args.batch, 1)
    counts = {"sent": 0, "failed": 0, "maybe": 0, "bytes": 0}
    first_error: list[BaseException] = []
    progress = Progress(f"produce {args.topic}")
    producer = Producer(args.group, args.broker)
    await producer.start()

    def start_one(chunk: list[bytes]) -> asyncio.Future[SendResult]:
        msgs = [Message(args.topic, b, tags=args.tag, keys=args.key) for b in chunk]
        if args.batch == 1:
            return producer.send_async(msgs[0])
        return asyncio.ensure_future(producer.send_batch(msgs))

    def finished(chunk: list[bytes], fut: asyncio.Future[SendResult]) -> None:
        exc = None if fut.cancelled() else fut.exception()
        if exc is None and not fut.cancelled() and fut.result().ok:
            counts["sent"] += len(chunk)
            counts["bytes"] += sum(len(b) for b in chunk)
        else:
            if exc is not None and not first_error:
                first_error.append(exc)
            # a peer that answered in text (an HTTP port) stored nothing
            maybe = exc is None or (getattr(exc, "maybe_stored", False)
                                    and not cli_errors.text_length_hint(str(exc)))
            key = "maybe" if maybe else "failed"
            counts[key] += len(chunk)
        progress.tick(counts["sent"] + counts["failed"] + counts["maybe"], len(payloads))

    start = time.perf_counter()
    try:
        await windowed(chunks, window, start_one, finished)
    finally:
        elapsed = time.perf_counter() - start
        progress.clear()
        await producer.shutdown()
    result = {"topic": args.topic, "requested": len(payloads), "sent": counts["sent"],
              "failed": counts["failed"], "maybe_stored": counts["maybe"],
              "seconds": round(elapsed, 3), "bytes": counts["bytes"],
              "msgs_s": round(counts["sent"] / elapsed, 1) if elapsed > 0 else 0.0}
    if counts["sent"] < len(payloads):
        why = cli_errors.describe(first_error[0]) if first_error else "no acknowledgement"
        print(f"tidemq: {len(payloads) - counts['sent']} of {len(payloads)} messages not "
              f"acknowledged: {why}", file=sys.stderr)
        return result, cli_errors.EXIT_INCOMPLETE
    return result, cli_errors.EXIT_OK


async def windowed(items: Iterable[T], window: int,
                   start_one: Callable[[T], asyncio.Future[Any]],
                   finished: Callable[[T, asyncio.Future[Any]], None]) -> None:
    """Keep at most `window` of start_one(item) futures running until all items are done."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    it = iter(items)
    state = {"running": 0, "exhausted": False}

    def launch() -> None:
        while state["running"] < window and not state["exhausted"]:
            item = next(it, None)
            if item is None:
                state["exhausted"] = True
                break
            state["running"] += 1
            start_one(item).add_done_callback(lambda f, n=item: on_done(n, f))  # type: ignore[misc]
        if state["exhausted"] and state["running"] == 0 and not done.done():
            done.set_result(None)

    def on_done(item: T, fut: asyncio.Future[Any]) -> None:
        state["running"] -= 1
        finished(item, fut)
        launch()

    launch()
    await done
