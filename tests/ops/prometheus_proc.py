"""A real Prometheus (Debian package) as a process for tests: temporary config and TSDB,
127.0.0.1 only, stopped with SIGTERM.

    with PrometheusProcess(tmp_path, targets={"tidemq-broker": [(addr, labels)]},
                           rule_files=[path]) as prom:
        prom.wait_for(lambda: prom.value('up') == 1, 20, "first scrape")
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request

import yaml

from tests.support.ports import free_port


class PrometheusProcess:
    def __init__(self, binary: str, directory, targets: dict, rule_files=(), interval_s: int = 1):
        self.binary = binary
        self.dir = str(directory)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = os.path.join(self.dir, "prometheus.yml")
        doc = {"global": {"scrape_interval": f"{interval_s}s",
                          "evaluation_interval": f"{interval_s}s"},
               "rule_files": list(rule_files),
               "scrape_configs": [
                   {"job_name": job, "static_configs": [
                       {"targets": [addr], "labels": labels} for addr, labels in tgts]}
                   for job, tgts in targets.items()]}
        with open(self.config, "w") as f:
            yaml.safe_dump(doc, f)
        self.proc = None
        self.log_path = os.path.join(self.dir, "prometheus.log")

    def start(self, timeout_s: float = 20.0) -> PrometheusProcess:
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.config}",
             f"--storage.tsdb.path={os.path.join(self.dir, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.wait_for(self._ready, timeout_s, "Prometheus /-/ready")
        return self

    def _ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited: {self.log_text()}"
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def log_text(self) -> str:
        try:
            return open(self.log_path, encoding="utf-8", errors="replace").read()[-4000:]
        except OSError:
            return ""

    # -- HTTP API --------------------------------------------------------------------------
    def api(self, path: str, **params) -> dict:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as exc:   # 400/422: a bad query, with Prometheus' reason
            doc = json.loads(exc.read())
        return doc

    def query(self, expr: str) -> list:
        doc = self.api("query", query=expr)
        assert doc["status"] == "success", (expr, doc)
        return doc["data"]["result"]

    def value(self, expr: str):
        """The single sample's value as a float, None when the result is empty."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    def alerts(self) -> list:
        return self.api("alerts")["data"]["alerts"]

    def wait_for(self, predicate, timeout_s: float, what):
        deadline = time.monotonic() + timeout_s
        while True:
            got = predicate()
            if got:
                return got
            if time.monotonic() > deadline:
                what = what() if callable(what) else what   # a description of the state now
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n"
                                     f"{self.log_text()}")
            time.sleep(0.25)
