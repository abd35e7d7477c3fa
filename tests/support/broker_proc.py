"""A real broker process for tests: `python -m tidemq.node` with a temp store, ports picked by the OS.

    from tests.support.broker_proc import BrokerProcess, broker, broker_factory  # fixtures

    def test_x(broker):                 # a started broker, stopped (SIGTERM) at teardown
        host, port = broker.host, broker.port     # broker.addr == "127.0.0.1:<port>"
        broker.admin_url                          # "http://127.0.0.1:<admin port>"

    def test_y(broker_factory):         # several brokers or custom settings
        b = broker_factory("store.flush_mode=SYNC_FLUSH", "auto_create_topic=false").start()
        b.restart()                     # SIGTERM, wait, start again on the same store (new ports)
        b.kill()                        # SIGKILL

HA groups (node/replication/service.py): `ha_group(broker_factory, tmp_path, slaves=1)` starts a master
and slaves sharing a secret file; the master's HA port is pre-chosen so it survives restarts
(`b.ha_port` is what the READY line reported).

The broker's stderr (its log) goes to `<root>/../broker-<n>.log` (`b.log_text()`); stdout
carries only the READY line. The store uses small files (16 MiB commit-log files, a small
index) so start-up is quick; pass settings to override.
"""
from __future__ import annotations

import itertools
import os
import select
import signal
import subprocess
import sys
import time

import pytest

READY = "TIDEMQ_BROKER_READY"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL_STORE = ("store.commitlog_file_bytes=16777216", "store.index_slots=16384",
               "store.index_entries=65536", "store.consume_queue_file_units=16384")
_ids = itertools.count(1)


class BrokerProcess:
    def __init__(self, root_dir: str, settings=(), config_path: str | None = None,
                 small_store: bool = True, env: dict | None = None, preexec_fn=None):
        self.root_dir = root_dir
        self.preexec_fn = preexec_fn  # run in the child before exec (e.g. resource limits)
        self.settings = list(settings)
        self.config_path = config_path
        self.small_store = small_store
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.admin_port = 0
        self.ha_port = 0
        self.grpc_port = 0
        self.log_path = os.path.join(os.path.dirname(root_dir.rstrip("/")) or ".",
                                     f"broker-{next(_ids)}.log")

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "tidemq.node"]
        if self.config_path:
            cmd += ["-c", self.config_path]
        sets = ["listen_port=0", "admin_port=0", f"store.root_dir={self.root_dir}"]
        sets += list(SMALL_STORE) if self.small_store else []
        for item in sets + self.settings:
            cmd += ["--set", item]
        return cmd

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=log,
                                         stdin=subprocess.DEVNULL, cwd=REPO_ROOT, env=env,
                                         preexec_fn=self.preexec_fn)
        finally:
            log.close()
        line = self._read_ready(timeout)
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        self.host, port = fields["remoting"].rsplit(":", 1)
        self.port = int(port)
        self.admin_port = int(fields["admin"].rsplit(":", 1)[1])
        self.ha_port = int(fields["ha"].rsplit(":", 1)[1]) if "ha" in fields else 0
        self.grpc_port = int(fields["grpc"].rsplit(":", 1)[1]) if "grpc" in fields else 0
        return self

    def _read_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        buf = b""
        fd = self.proc.stdout.fileno()
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buf += chunk
                if b"\n" in buf:
                    line = buf.split(b"\n", 1)[0].decode()
                    if line.startswith(READY):
                        return line
            elif self.proc.poll() is not None:
                break
        self.kill()
        raise RuntimeError(f"broker did not become ready (exit {self.proc.returncode}); "
                           f"log:\n{self.log_text()[-4000:]}")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the broker shuts down cleanly. Returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"broker did not stop within {timeout} s") from None
        finally:
            self.proc.stdout.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, timeout: float = 30.0) -> BrokerProcess:
        rc = self.stop()
        assert rc == 0, f"broker exited {rc}; log:\n{self.log_text()[-4000:]}"
        return self.start(timeout)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def __enter__(self):
        return self.start() if not self.alive else self

    def __exit__(self, *exc):
        try:
            self.stop()
        finally:
            self.kill()


@pytest.fixture
def broker_factory(tmp_path):
    made: list[BrokerProcess] = []

    def make(*settings, name: str | None = None, **kwargs) -> BrokerProcess:
        root = tmp_path / (name or f"store{len(made)}")
        b = BrokerProcess(str(root), settings, **kwargs)
        made.append(b)
        return b

    yield make
    for b in made:
        try:
            b.stop()
        finally:
            b.kill()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory().start()


HA_SECRET = b"tidemq-test-ha-secret-0123456789"
# Quick liveness for tests: beats every 200 ms, a peer silent for 1.5 s is dropped.
HA_FAST = ("ha.heartbeat_interval_ms=200", "ha.peer_timeout_ms=1500", "ha.max_lag_ms=3000")


def ha_secret_file(directory, secret: bytes = HA_SECRET) -> str:
    path = os.path.join(str(directory), "ha-secret")
    with open(path, "wb") as f:
        f.write(secret + b"\n")
    return path


def ha_master_settings(secret_file: str, ha_port: int, *extra) -> tuple:
    return ("ha.role=MASTER", f"ha.secret_file={secret_file}", f"ha.listen_port={ha_port}",
            *HA_FAST, *extra)


def ha_slave_settings(secret_file: str, master_ha_port: int, broker_id: int = 1,
                      *extra) -> tuple:
    return ("ha.role=SLAVE", f"broker_id={broker_id}", f"ha.secret_file={secret_file}",
            f"ha.master_addr=127.0.0.1:{master_ha_port}", *HA_FAST,
            "ha.listen_port=0",  # if promoted: never the default port another test may hold
            *extra)


def ha_group(broker_factory, directory, slaves: int = 1, master_extra=(), slave_extra=(),
             start_slaves: bool = True):
    """(master, [slaves]) started; the master on a pre-chosen HA port."""
    from tests.support.ports import free_port
    secret = ha_secret_file(directory)
    port = free_port()
    master = broker_factory(*ha_master_settings(secret, port, *master_extra),
                            name="master").start()
    assert master.ha_port == port, master.ha_port
    made = []
    for i in range(1, slaves + 1):
        b = broker_factory(*ha_slave_settings(secret, port, i, *slave_extra), name=f"slave{i}")
        made.append(b.start() if start_slaves else b)
    return master, made
