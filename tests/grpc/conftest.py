"""gRPC tests: a real broker with its gRPC port on, driven by the official RocketMQ 5 Python SDK
running in its own interpreter (tests/grpc/rmq5_driver.py), one JSON command per line.

The SDK's interpreter: TIDEMQ_RMQ5_PYTHON, else <repo>/.venv-rmq5/bin/python (scripts/setup.sh
creates it). Missing it (or grpcio in this interpreter, which the broker needs) skips these
tests locally and fails them under CI, so a missing install step never becomes a skip there.
"""
from __future__ import annotations

import json
import os
import select
import subprocess

import pytest

from tests.support.broker_proc import REPO_ROOT, BrokerProcess, broker_factory  # noqa: F401

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rmq5_driver.py")
GRPC_SETTINGS = ("grpc_port=0", "grpc_fifo_groups=FifoG,FifoPushG", "grpc_max_delivery_attempts=3",
                 "transaction_timeout_ms=1000", "transaction_check_interval_ms=1000")


def rmq5_python() -> str:
    return os.environ.get("TIDEMQ_RMQ5_PYTHON") or os.path.join(REPO_ROOT, ".venv-rmq5", "bin",
                                                                  "python")


def _require_sdk() -> None:
    problem = None
    try:
        import grpc  # noqa: F401  the broker side
    except ImportError:
        problem = "grpcio is not installed (pip install -e '.[grpc]')"
    if problem is None and not os.access(rmq5_python(), os.X_OK):
        problem = f"no RocketMQ 5 SDK interpreter at {rmq5_python()} (run scripts/setup.sh)"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)


class Rmq5Client:
    """One SDK process: `call(op, **fields)` sends a command and returns its JSON answer."""

    def __init__(self, endpoint: str, log_path: str, env: dict | None = None):
        self.log = open(log_path, "ab")  # noqa: SIM115  closed in close()
        self.proc = subprocess.Popen([rmq5_python(), DRIVER, endpoint], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, cwd=REPO_ROOT,
                                     env={**os.environ, **(env or {})})

    def call(self, op: str, timeout: float = 30.0, **fields) -> dict:
        self.start(op, **fields)
        return self.answer(op, timeout)

    def start(self, op: str, **fields) -> None:
        """Send a command without waiting; `answer` reads its reply."""
        self.proc.stdin.write((json.dumps({"op": op, **fields}) + "\n").encode())
        self.proc.stdin.flush()

    def answer(self, op: str, timeout: float = 30.0) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"SDK driver gave no answer to {op!r} within {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"SDK driver exited (rc={self.proc.poll()}) during {op!r}")
        return json.loads(line)

    def ok(self, op: str, **fields) -> dict:
        reply = self.call(op, **fields)
        assert reply["ok"], reply
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("shutdown", timeout=15)
            except (TimeoutError, RuntimeError, BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def grpc_broker(tmp_path_factory):
    _require_sdk()
    b = BrokerProcess(str(tmp_path_factory.mktemp("grpc") / "store"), GRPC_SETTINGS).start()
    assert b.grpc_port > 0
    yield b
    rc = b.stop()
    assert rc == 0, f"broker exited {rc}:\n{b.log_text()[-3000:]}"


@pytest.fixture
def sdk(grpc_broker, tmp_path):
    """A factory of SDK processes connected to grpc_broker; all closed at teardown."""
    clients = []

    def make(broker=None, env: dict | None = None) -> Rmq5Client:
        """env: RMQ5_AK / RMQ5_SK (ACL), RMQ5_TLS=1 (see rmq5_driver.py)."""
        b = broker or grpc_broker
        c = Rmq5Client(f"127.0.0.1:{b.grpc_port}", str(tmp_path / f"sdk-{len(clients)}.log"),
                       env)
        clients.append(c)
        return c
    yield make
    for c in clients:
        c.close()
