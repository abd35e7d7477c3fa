"""`tidemq` command line: run servers, manage topics and groups, produce and consume, inspect.

    tidemq broker|namesrv|certs|handoff [options...]     servers and tools (their own --help)
    tidemq [-b ADDR] topic create|update|delete|list|stats|route ...
    tidemq [-b ADDR] produce T [--body TEXT | --body-file F | --stdin] [--count N] ...
    tidemq [-b ADDR] consume T [G] [--count N] [--follow] [--peek] [--queue Q --offset O] ...
    tidemq [-b ADDR] message query|get ...,  dlq G,  dlq-resend G --id ID,  txn parked
    tidemq [-b ADDR] consumer progress|connections G,  producer connections G
    tidemq [-b ADDR] group list|reset|delete ...,  brokers status,  cluster list
    tidemq cluster up|status|down|restart ...            a local cluster of processes

ADDR is a broker `host:port` or one or several name servers (`"ns1:9876;ns2:9876"`); through
name servers every command runs on each broker group and the answers are merged
(client/admin_fanout.py). Without -b: env TIDEMQ_BROKER, then NAMESRV_ADDR, then
127.0.0.1:10911. `-b` and `-o` may come before or after the subcommand.

Output: tables on a terminal, JSON otherwise (`-o json|table` to choose). Exit codes: 0 done;
1 error (one line on stderr, with a hint); 2 bad usage; 3 incomplete (fewer messages received
than --count, or sends not acknowledged); 130 interrupted; 141 stdout closed (`| head`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

from tidemq import errors, security
from tidemq.cli import consume as cli_consume
from tidemq.cli import errors as cli_errors
from tidemq.cli import inspect as cli_inspect
from tidemq.cli import messaging as cli_messaging
from tidemq.cli import ops as cli_ops
from tidemq.cli import output as cli_output
from tidemq.cli import produce as cli_produce
from tidemq.cli import topic as cli_topic

DEFAULT_BROKER = "127.0.0.1:10911"
_GLOBAL_WITH_VALUE = ("-b", "--broker", "-n", "--namesrv", "-o", "--output",
                      "--credentials-file", "--tls-ca")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (when it has a meaningful one and the help does not name
    it already) and keeps the descriptions' line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default in (None, False, argparse.SUPPRESS) or "default" in text
                or not action.option_strings or default == []):
            return text
        return f"{text} (default: {default})"


class Common:
    """What every subcommand parser gets: the help formatter and the -b/-o options."""

    fmt: dict[str, Any] = {"formatter_class": _Formatter}

    @staticmethod
    def add(parser: argparse.ArgumentParser, default: str | None = argparse.SUPPRESS) -> None:
        parser.add_argument("-b", "-n", "--broker", "--namesrv", dest="broker", default=default,
                            help="broker host:port, or name servers \"ns1:9876;ns2:9876\" "
                            f"(env TIDEMQ_BROKER or NAMESRV_ADDR; else {DEFAULT_BROKER})")
        parser.add_argument("-o", "--output", choices=cli_output.MODES, default=default,
                            help="output format: auto = a table on a terminal, JSON otherwise")


def version() -> str:
    try:
        from importlib.metadata import version as dist_version
        return dist_version("tidemq")
    except Exception:   # not installed (run from a source tree)
        return "0.1.0+source"


def build_parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="tidemq", description=__doc__, **Common.fmt)
    Common.add(top, None)
    top.add_argument("--version", action="version", version=f"tidemq {version()}")
    top.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    # Secrets never on the command line: a file name here, or environment (client/security.py).
    top.add_argument("--credentials-file", help="TOML file with access_key and secret_key "
                     "(env TIDEMQ_CREDENTIALS_FILE, or TIDEMQ_ACCESS_KEY + TIDEMQ_SECRET_KEY)")
    top.add_argument("--tls-ca", help="connect with TLS, trusting this CA file (env TIDEMQ_TLS_CA; "
                     "TIDEMQ_TLS=1 for the system CAs)")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, what in (("broker", "run a broker node"),
                       ("namesrv", "run a name server for a ZooKeeper cluster (needs the "
                        "`cluster` extra: pip install 'tidemq[cluster]')"),
                       ("certs", "make a self-signed development CA and TLS certificates"),
                       ("handoff", "move a group's master role to an in-sync slave")):
        sub.add_parser(name, help=f"{what} (options: `tidemq {name} --help`)", add_help=False)
    cli_topic.add_parsers(sub, Common)
    cli_produce.add_parser(sub, Common)
    cli_consume.add_parser(sub, Common)
    consumer_sub = cli_messaging.add_parsers(sub, Common)
    cli_ops.add_parsers(sub, Common)
    cli_inspect.add_parsers(sub, Common, consumer_sub)
    return top


_SERVERS = {"broker": ("tidemq.node.main", "run_broker"), "certs": ("tidemq.node.tools.dev_certs", "run_certs"),
            "namesrv": ("tidemq.node.namesrv.server", "run_namesrv"), "handoff": ("tidemq.coordinator.handoff", "main")}


def _run_server(name: str, argv: list[str]) -> int:
    """Lazily: the SDK must not need the server's packages; a missing one is one line."""
    import importlib
    module, fn = _SERVERS[name]
    try:
        entry = getattr(importlib.import_module(module), fn)
    except ImportError as exc:
        package = (exc.name or "?").split(".")[0]
        install = "'tidemq[cluster]'" if name in ("namesrv", "handoff") else "tidemq"
        print(f"tidemq {name}: missing Python package {package!r} (hint: pip install {install})",
              file=sys.stderr)
        return cli_errors.EXIT_ERROR
    rc: int = entry(argv)
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    at = _subcommand_index(argv)
    if at is not None and argv[at] in _SERVERS:
        return _run_server(argv[at], argv[at + 1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.broker = (args.broker or os.environ.get("TIDEMQ_BROKER") or os.environ.get("NAMESRV_ADDR")
                   or DEFAULT_BROKER)
    args.output = args.output or "auto"
    try:
        security.set_default(security.from_environment(args.credentials_file, args.tls_ca))
        result = asyncio.run(_dispatch(args))
    except (errors.TideMQError, ValueError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            return _broken_pipe()
        print(f"tidemq: {cli_errors.describe(exc)}", file=sys.stderr)
        return cli_errors.EXIT_ERROR
    except KeyboardInterrupt:
        return cli_errors.EXIT_INTERRUPTED
    rc: int
    result, rc = result if isinstance(result, tuple) else (result, cli_errors.EXIT_OK)
    try:
        cli_output.emit(result, args.output)
    except BrokenPipeError:
        return _broken_pipe()
    return rc


def _broken_pipe() -> int:
    cli_consume._silence_stdout()
    return cli_errors.EXIT_PIPE


def _subcommand_index(argv: list[str]) -> int | None:
    """Index of the subcommand, skipping the global options before it."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _GLOBAL_WITH_VALUE:
            i += 2
        elif arg.startswith("--") and "=" in arg or arg in ("-v", "--verbose") or \
                (arg[:2] in ("-b", "-n", "-o") and len(arg) > 2):
            i += 1
        elif arg.startswith("-"):
            return None  # e.g. --help: argparse answers
        else:
            return i
    return None


async def _dispatch(args: argparse.Namespace) -> Any:
    if args.command == "topic":
        return await cli_topic.dispatch(args)
    if args.command == "produce":
        return await cli_produce.run(args)
    if args.command == "consume":
        return await cli_consume.run(args)
    if args.command == "message":
        return await cli_topic.message_query(args)
    if args.command in cli_messaging.COMMANDS or getattr(args, "consumer_command", "") == "progress":
        return await cli_messaging.dispatch(args)
    if args.command in cli_ops.COMMANDS:
        return await cli_ops.dispatch(args)
    return await cli_inspect.dispatch(args)


if __name__ == "__main__":
    sys.exit(main())
