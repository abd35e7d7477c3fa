"""A real `tidemq namesrv` process for tests (ports picked by the OS, log to a file)."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time

from tests.support.broker_proc import REPO_ROOT

READY = "TIDEMQ_NAMESRV_READY"


class NameServerProcess:
    def __init__(self, zk_hosts: str, cluster: str, log_path: str, session_timeout_ms=2000):
        self.cmd = [sys.executable, "-m", "tidemq.cli.main", "namesrv", "--zk", zk_hosts,
                    "--cluster", cluster, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                    "--session-timeout-ms", str(session_timeout_ms)]
        self.log_path = log_path
        self.proc = None
        self.addr = self.http_url = ""

    def start(self, timeout: float = 30.0) -> NameServerProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=log,
                                         stdin=subprocess.DEVNULL, cwd=REPO_ROOT, env=env)
        deadline = time.monotonic() + timeout
        buf = b""
        while time.monotonic() < deadline and b"\n" not in buf:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
            elif self.proc.poll() is not None:
                break
        line = buf.split(b"\n", 1)[0].decode()
        if not line.startswith(READY):
            self.stop()
            raise RuntimeError(f"namesrv not ready: {line!r}; log:\n{self.log_text()[-3000:]}")
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        self.addr = fields["remoting"]
        self.http_url = "http://" + fields["http"]
        return self

    def log_text(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
