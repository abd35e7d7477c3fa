"""`tidemq broker` / `python -m tidemq.node`: run one broker until SIGTERM or SIGINT.

    run_broker(["-c", "broker.toml", "--set", "listen_port=0", "--set", "store.root_dir=/d"])

Prints exactly one line on stdout once both servers listen (tests and the CLI wait for it):

    TIDEMQ_BROKER_READY remoting=127.0.0.1:<port> admin=127.0.0.1:<port> [ha=...] [grpc=...]

`--dev` is a small development profile: a fresh temporary store (deleted at a clean exit)
with small files (16 MiB commit-log files, ~70 MB on disk when empty instead of ~1.5 GB);
`-c` and `--set` still apply on top of it.

Logs go to stderr. Exit status: 0 after a clean shutdown, 2 for a bad config, 1 when the
broker could not start (a port in use or a store in use is one line with a hint) or a
background task died.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import faulthandler
import gc
import json
import logging
import shutil
import signal
import sys
import tempfile

from tidemq.node.broker import Broker
from tidemq.node.config import ConfigError, describe, load_config, redacted
from tidemq.node.fd_limit import raise_open_file_limit
from tidemq.node.replication.service import store_config
from tidemq.node.security.settings import log_cert_expiry

log = logging.getLogger("tidemq.main")
READY_PREFIX = "TIDEMQ_BROKER_READY"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidemq broker", description="Run a TideMQ broker.")
    p.add_argument("-c", "--config", help="TOML config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted for tables: store.flush_mode=SYNC_FLUSH)")
    p.add_argument("--describe-config", action="store_true",
                   help="print every config key with its default, as Markdown, and exit")
    p.add_argument("--dev", action="store_true",
                   help="development profile: a temporary store with small files, removed at exit")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    return p


# --dev: small files (an empty default store preallocates ~1.5 GB: 1 GiB commit log, a 100 MB
# and a 400 MB index file...); the user's -c/--set still win.
DEV_OVERRIDES = ("store.commitlog_file_bytes=16777216", "store.consume_queue_file_units=30000",
                 "store.index_slots=50000", "store.index_entries=200000")


def run_broker(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.describe_config:
        print(describe())
        return 0
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>`: dump stacks
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dev_dir = tempfile.mkdtemp(prefix="tidemq-dev-") if args.dev else None
    dev = [*DEV_OVERRIDES, f"store.root_dir={dev_dir}"] if dev_dir else []
    try:
        cfg = load_config(args.config, dev + args.overrides)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        _remove_dev_store(dev_dir)
        return 2
    # What the broker really runs: a replicated store confirms through HA (external).
    cfg = dataclasses.replace(cfg, store=store_config(cfg))
    log.info("effective config: %s", json.dumps(redacted(cfg), sort_keys=True))
    raise_open_file_limit(cfg.store.min_free_fds)
    log_cert_expiry(cfg)
    try:
        return asyncio.run(_serve(cfg))
    except KeyboardInterrupt:
        return 0
    finally:
        _remove_dev_store(dev_dir)


def _remove_dev_store(dev_dir: str | None) -> None:
    if dev_dir:
        shutil.rmtree(dev_dir, ignore_errors=True)


def start_failure(exc: BaseException, cfg) -> str | None:
    """The one-line reason for a start failure an operator commonly causes, else None."""
    from tidemq.node.store.errors import StoreLocked
    if isinstance(exc, StoreLocked):
        return (f"{exc} (hint: another broker runs on this store; stop it, or give this one "
                f"its own --set store.root_dir=...)")
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return (f"a port is already in use ({exc.strerror}; remoting {cfg.listen_port}, admin "
                f"{cfg.admin_port}) (hint: another broker runs here; pick free ports with "
                f"--set listen_port=... --set admin_port=..., or 0 for any)")
    if isinstance(exc, PermissionError):
        return f"{exc} (hint: the user running the broker cannot use this path or port)"
    return None


def _tune_gc() -> None:
    """Move start-up objects out of the collector's way and collect young objects less often:
    request garbage is acyclic (freed by reference counting), so frequent gen-0 passes over
    ~700 objects only cost time on the request path."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


async def _serve(cfg) -> int:
    broker = Broker(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await broker.start()
    except Exception as exc:
        reason = start_failure(exc, cfg)
        if reason is None:
            log.exception("broker failed to start")
        else:   # a common mistake: one line with a hint, not a traceback
            print(f"tidemq broker: {reason}", file=sys.stderr, flush=True)
        await broker.stop()
        return 1
    _tune_gc()
    ha = ""
    if broker.replication is not None and broker.replication.listen_port:
        ha = f" ha={cfg.ha.listen_host}:{broker.replication.listen_port}"
    if broker.grpc is not None:
        ha += f" grpc={cfg.listen_host}:{broker.grpc_port}"
    print(f"{READY_PREFIX} remoting={cfg.listen_host}:{broker.remoting_port} "
          f"admin={cfg.admin_host}:{broker.admin_port}{ha}", flush=True)
    stop_wait = loop.create_task(stop.wait())
    fail_wait = loop.create_task(broker.failed.wait())
    await asyncio.wait({stop_wait, fail_wait}, return_when=asyncio.FIRST_COMPLETED)
    stop_wait.cancel()
    fail_wait.cancel()
    failed = broker.failed.is_set()
    log.info("shutting down%s", " after a failure" if failed else "")
    await broker.stop()
    return 1 if failed else 0
