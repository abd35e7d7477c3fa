"""A real ZooKeeper for tests: an external ensemble (ZK_HOSTS), a testcontainers container
where a Docker engine answers, or Debian's `zookeeper` package started as a java process on
127.0.0.1. Standalone or a 3-node ensemble with kill/restart helpers.

Settings from measurement (docs/replication.md, Kazoo settings): tickTime 200 ms and
minSessionTimeout 1000 ms, so a 2 s client session really is 2 s (Debian's tickTime 2000
silently raises it to 4 s), and no AdminServer (it would grab port 8080).

TLS (`ZkCluster(1, tls=certs)`, certs from node/tools/dev_certs.py): a secureClientPort beside the
plaintext one (kept for the `srvr` readiness probe), served by Netty with PEM files and
`ssl.clientAuth=need`. Debian's zookeeper.jar manifest leaves netty-codec off its Class-Path
(the TLS handshake then fails with NoClassDefFoundError ByteToMessageDecoder), so it is added.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

from tests.support.ports import free_port

ZK_JAR = "/usr/share/java/zookeeper.jar"
SLF4J_JAR = "/usr/share/java/slf4j-simple.jar"
NETTY_CODEC_JAR = "/usr/share/java/netty-codec.jar"
MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


def four_letter(port: int, word: str, timeout: float = 1.0) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while True:
                data = s.recv(4096)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def serving_mode(port: int) -> str | None:
    """'standalone', 'leader' or 'follower' while the node serves requests, else None."""
    for line in four_letter(port, "srvr").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


class ZkNode:
    def __init__(self, base: str, myid: int, client_port: int, servers: list[str],
                 tls: dict | None = None):
        self.myid = myid
        self.client_port = client_port
        self.tls = tls
        self.secure_port = free_port() if tls else 0
        self.dir = os.path.join(base, f"zk{myid}")
        os.makedirs(os.path.join(self.dir, "data"), exist_ok=True)
        with open(os.path.join(self.dir, "data", "myid"), "w") as f:
            f.write(str(myid))
        lines = ["tickTime=200", "initLimit=10", "syncLimit=5",
                 f"dataDir={self.dir}/data", f"clientPort={client_port}",
                 "clientPortAddress=127.0.0.1", "admin.enableServer=false",
                 "4lw.commands.whitelist=ruok,srvr,stat,mntr,conf,cons",
                 "minSessionTimeout=1000", "maxSessionTimeout=20000", "maxClientCnxns=0"]
        lines += servers
        if tls:
            bundle = os.path.join(self.dir, "server-bundle.pem")   # ZooKeeper's PEM keystore
            with open(bundle, "w") as out:
                for name in ("server_cert", "server_key"):
                    with open(tls[name]) as f:
                        out.write(f.read())
            lines += [f"secureClientPort={self.secure_port}", "secureClientPortAddress=127.0.0.1",
                      "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                      f"ssl.keyStore.location={bundle}", "ssl.keyStore.type=PEM",
                      f"ssl.trustStore.location={tls['ca_cert']}", "ssl.trustStore.type=PEM",
                      "ssl.clientAuth=need"]
        self.cfg = os.path.join(self.dir, "zoo.cfg")
        with open(self.cfg, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cp = ZK_JAR + (":" + SLF4J_JAR if os.path.exists(SLF4J_JAR) else "")
        if self.tls:
            cp += ":" + NETTY_CODEC_JAR
        log = open(os.path.join(self.dir, "server.log"), "ab")
        self.proc = subprocess.Popen(
            ["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", cp, MAIN, self.cfg],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(os.path.join(self.dir, "server.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class ZkCluster:
    """`size` ZooKeeper nodes on 127.0.0.1 (1 = standalone)."""

    def __init__(self, size: int = 1, tls: dict | None = None):
        self.tls = tls
        self._build(size)

    def _build(self, size: int) -> None:
        self.base = tempfile.mkdtemp(prefix="tidemq-zk-")
        ports = [(free_port(), free_port(), free_port()) for _ in range(size)]
        servers = [] if size == 1 else [
            f"server.{i + 1}=127.0.0.1:{p[1]}:{p[2]}" for i, p in enumerate(ports)]
        self.nodes = [ZkNode(self.base, i + 1, p[0], servers, self.tls)
                      for i, p in enumerate(ports)]

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{n.client_port}" for n in self.nodes)

    @property
    def secure_hosts(self) -> str:
        """The TLS ports (only with tls=...)."""
        assert self.tls, "ZkCluster started without tls"
        return ",".join(f"127.0.0.1:{n.secure_port}" for n in self.nodes)

    def start(self, timeout: float = 60.0, attempts: int = 3) -> ZkCluster:
        """Start every node and wait until all serve; on a stall start over on fresh ports."""
        for attempt in range(attempts):
            for n in self.nodes:
                n.start()
            try:
                self.wait_serving(timeout)
                return self
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
                for n in self.nodes:
                    n.kill()
                self._build(len(self.nodes))
        return self

    def wait_serving(self, timeout: float = 30.0, nodes=None) -> None:
        deadline = time.monotonic() + timeout
        pending = list(nodes or self.nodes)
        while pending and time.monotonic() < deadline:
            pending = [n for n in pending if serving_mode(n.client_port) is None]
            if pending:
                time.sleep(0.1)
        if pending:
            tails = "\n".join(f"--- zk{n.myid}: {n.log_tail()}" for n in pending)
            raise RuntimeError(f"ZooKeeper did not start serving in {timeout}s; logs in {self.base}\n{tails}")

    def leader(self) -> ZkNode | None:
        for n in self.nodes:
            if serving_mode(n.client_port) in ("leader", "standalone"):
                return n
        return None

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
        shutil.rmtree(self.base, ignore_errors=True)


def debian_zookeeper_available() -> bool:
    return os.path.exists(ZK_JAR) and shutil.which("java") is not None


def docker_available() -> bool:
    try:
        import docker  # testcontainers brings it
        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False
