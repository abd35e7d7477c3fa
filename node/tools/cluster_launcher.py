"""`tidemq cluster up|down|status`: the docker-compose topology as processes on this machine.

    tidemq cluster up [--dir D] [--groups 2] [--replicas 2] [--namesrvs 2] [--zk-nodes 3]
                      [--set KEY=VALUE ...]
    tidemq cluster status [--dir D]
    tidemq cluster restart NODE [--dir D]
    tidemq cluster down [--dir D] [--purge]

`up` starts a ZooKeeper ensemble (Debian's `zookeeper` package, run with java), the name
servers and the broker groups (`<cluster>-a`, `-b`, ...; broker ids 0..replicas-1, masters
elected through ZooKeeper), all on 127.0.0.1, detached from the terminal, each logging to
D/logs/. It waits until every group has a master and prints every endpoint as JSON. It also
writes D/prometheus.yml: a scrape config for a local Prometheus (brokers and name servers)
with the `cluster`/`group` target labels the alert rules expect
(`prometheus --config.file=D/prometheus.yml`). `--set` passes broker config keys to every
broker (after the launcher's own, so it can override them, e.g. the ZooKeeper session).

`restart NODE` starts one node that is not running (it died, or was killed) again with the
command, ports and data it had: a broker rejoins its group, a name server serves again.

State lives in D/cluster.json (ports, pids, commands). `down` stops brokers, then name servers,
then ZooKeeper (SIGTERM; SIGKILL after a grace period), and only processes still working in D
(a recycled pid is left alone). `--purge` also deletes D. Ports are picked free
below the ephemeral range when `up` runs and kept in the state file.
"""
from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
import urllib.request

STATE = "cluster.json"
DEFAULT_DIR = os.path.join("~", "tidemq", "cluster")
ZK_JAR = "/usr/share/java/zookeeper.jar"
SLF4J_JAR = "/usr/share/java/slf4j-simple.jar"
ZK_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
BROKER_READY = "TIDEMQ_BROKER_READY"
NAMESRV_READY = "TIDEMQ_NAMESRV_READY"
HOST = "127.0.0.1"


class LaunchError(RuntimeError):
    """The cluster could not be started or read; the message says what to do."""


# -- ports -----------------------------------------------------------------------------------
class _Ports:
    """Free ports below the kernel's ephemeral range (a port bind(0) gave out can be taken by
    an outgoing connection before a server binds it), each handed out once."""

    def __init__(self):
        self.given: set[int] = set()

    def take(self) -> int:
        for _ in range(2000):
            port = random.randrange(20000, 32000)
            if port in self.given:
                continue
            with socket.socket() as s:
                try:
                    s.bind((HOST, port))
                except OSError:
                    continue
            self.given.add(port)
            return port
        raise LaunchError("no free port found in 20000-32000")


# -- up --------------------------------------------------------------------------------------
def up(directory: str, *, groups: int = 2, replicas: int = 2, namesrvs: int = 2,
       zk_nodes: int = 3, cluster: str = "tidemq", commitlog_mib: int = 64,
       timeout_s: float = 120.0, overrides: list[str] | tuple = ()) -> dict:
    d = os.path.abspath(os.path.expanduser(directory))
    _check_up(d, {"groups": groups, "replicas": replicas, "namesrvs": namesrvs,
                  "zk_nodes": zk_nodes}, overrides)
    os.makedirs(os.path.join(d, "logs"), exist_ok=True)
    ports = _Ports()
    secret_file = os.path.join(d, "ha-secret")
    if not os.path.exists(secret_file):
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(24) + "\n")
    st = {"dir": d, "cluster": cluster, "zookeeper": [], "namesrvs": [], "brokers": []}
    try:
        _start_zookeeper(st, d, zk_nodes, ports)
        zk_hosts = ",".join(f"{HOST}:{z['client_port']}" for z in st["zookeeper"])
        st["zk_hosts"] = zk_hosts
        _wait(lambda: all(_zk_serving(z["client_port"]) for z in st["zookeeper"]), timeout_s,
              "ZooKeeper quorum", st)
        for i in range(namesrvs):
            rport, hport = ports.take(), ports.take()
            cmd = [sys.executable, "-m", "tidemq.cli.main", "namesrv", "--zk", zk_hosts,
                   "--cluster", cluster, "--listen", f"{HOST}:{rport}",
                   "--http", f"{HOST}:{hport}"]
            st["namesrvs"].append(_spawn(d, f"namesrv-{i}", cmd) | {
                "name": f"namesrv-{i}", "addr": f"{HOST}:{rport}",
                "http": f"http://{HOST}:{hport}"})
        base = [f"zookeeper.hosts={zk_hosts}", f"cluster_name={cluster}", "ha.role=cluster",
                f"ha.secret_file={secret_file}",
                f"store.commitlog_file_bytes={commitlog_mib * 1024 * 1024}"]
        for g in range(groups):
            _start_group(st, d, f"{cluster}-{string.ascii_lowercase[g]}", replicas, ports,
                         base, list(overrides))
        _save(d, st)
        for p in st["namesrvs"] + st["brokers"]:
            ready = NAMESRV_READY if p["name"].startswith("namesrv") else BROKER_READY
            _wait(lambda p=p, ready=ready: _ready(p, ready), timeout_s, f"{p['name']} ready", st)
        group_names = sorted({b["group"] for b in st["brokers"]})
        _wait(lambda: all(_master_of(st, g) for g in group_names), timeout_s,
              "a master in every group", st)
    except BaseException:
        _save(d, st)
        _stop_all(st)
        raise
    _write_prometheus(st)
    _save(d, st)
    return status(d)


def _check_up(d: str, counts: dict, overrides) -> None:
    """Refuse before starting anything: a running cluster in d, bad counts or --set items,
    no ZooKeeper to run."""
    if os.path.exists(os.path.join(d, STATE)):
        st = _load(d)
        if any(_alive(p, d) for p in _procs(st)):
            raise LaunchError(f"a cluster from {d} is running: `tidemq cluster down --dir {d}` "
                              f"first (or `tidemq cluster restart NODE` for one stopped node)")
    for name, n in counts.items():
        if not 1 <= n <= 26:
            raise LaunchError(f"--{name.replace('_', '-')} must be 1..26")
    for kv in overrides:
        if "=" not in kv or not kv.split("=", 1)[0].strip():
            raise LaunchError(f"--set {kv!r}: expected KEY=VALUE (see `tidemq broker "
                              f"--describe-config`)")
    if not os.path.exists(ZK_JAR) or shutil.which("java") is None:
        raise LaunchError("ZooKeeper needs Debian's `zookeeper` package and java "
                          "(apt-get install zookeeper default-jre-headless)")


def _start_group(st, d: str, group: str, replicas: int, ports, base: list[str],
                 overrides: list[str]) -> None:
    """Brokers <group>-0..replicas-1; the user's --set keys come last, so they win."""
    for i in range(replicas):
        node = f"{group}-{i}"
        rport, aport, hport = ports.take(), ports.take(), ports.take()
        sets = base + [f"broker_name={group}", f"broker_id={i}", f"ha.node_id={node}",
                       f"ha.listen_port={hport}", f"listen_port={rport}", f"admin_port={aport}",
                       f"store.root_dir={os.path.join(d, 'data', node)}"] + overrides
        cmd = [sys.executable, "-m", "tidemq.node"] + [x for s in sets for x in ("--set", s)]
        st["brokers"].append(_spawn(d, node, cmd) | {
            "name": node, "group": group, "broker_id": i, "addr": f"{HOST}:{rport}",
            "admin": f"http://{HOST}:{aport}", "ha": f"{HOST}:{hport}"})


def _start_zookeeper(st, d, n, ports) -> None:
    nodes = [{"myid": i + 1, "client_port": ports.take(), "peer_port": ports.take(),
              "election_port": ports.take()} for i in range(n)]
    servers = [f"server.{z['myid']}={HOST}:{z['peer_port']}:{z['election_port']}"
               for z in nodes] if n > 1 else []
    cp = ZK_JAR + (":" + SLF4J_JAR if os.path.exists(SLF4J_JAR) else "")
    for z in nodes:
        zdir = os.path.join(d, "zookeeper", f"zk-{z['myid']}")
        os.makedirs(os.path.join(zdir, "data"), exist_ok=True)
        with open(os.path.join(zdir, "data", "myid"), "w") as f:
            f.write(str(z["myid"]))
        cfg = os.path.join(zdir, "zoo.cfg")
        with open(cfg, "w") as f:   # tick 500 ms allows 1 s sessions (min is 2 ticks by default)
            f.write("\n".join(["tickTime=500", "initLimit=20", "syncLimit=10",
                               f"dataDir={zdir}/data", f"clientPort={z['client_port']}",
                               f"clientPortAddress={HOST}", "admin.enableServer=false",
                               "4lw.commands.whitelist=ruok,srvr,mntr",
                               "minSessionTimeout=1000", "maxSessionTimeout=20000",
                               "maxClientCnxns=0"] + servers) + "\n")
        cmd = ["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", cp, ZK_MAIN, cfg]
        st["zookeeper"].append(_spawn(d, f"zk-{z['myid']}", cmd) | z | {"name": f"zk-{z['myid']}"})


def _spawn(d: str, name: str, cmd: list[str]) -> dict:
    log = os.path.join(d, "logs", f"{name}.log")
    with open(log, "ab") as f:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                start_new_session=True, cwd=d,
                                env=dict(os.environ, PYTHONPATH=_project_root()))
    return {"pid": proc.pid, "log": log, "cmd": cmd}


def _project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ready(p: dict, marker: str, from_byte: int = 0) -> bool:
    """The process printed `marker` in its log after byte `from_byte` (a restart appends)."""
    if not _alive(p, None):
        raise LaunchError(f"{p['name']} exited; log {p['log']}:\n{_tail(p['log'])}")
    with open(p["log"], errors="replace") as f:
        f.seek(from_byte)
        return any(line.startswith(marker) for line in f)


def _zk_serving(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1) as s:
            s.sendall(b"srvr")
            data = s.recv(4096).decode(errors="replace")
        return "Mode:" in data
    except OSError:
        return False


def _wait(pred, timeout_s: float, what: str, st) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise LaunchError(f"timed out after {timeout_s:.0f} s waiting for {what}; logs in "
                              f"{os.path.join(st['dir'], 'logs')}")
        time.sleep(0.2)


def _view(st) -> dict:
    for n in st["namesrvs"]:
        try:
            with urllib.request.urlopen(n["http"] + "/cluster", timeout=3) as r:
                return json.loads(r.read())
        except OSError:
            continue
    return {}


def _master_of(st, group: str):
    return ((_view(st).get("groups") or {}).get(group) or {}).get("master")


def _write_prometheus(st) -> None:
    lines = ["# Written by `tidemq cluster up`: prometheus --config.file=<this file>",
             "global: {scrape_interval: 5s, evaluation_interval: 5s}",
             f"rule_files: [{json.dumps(os.path.join(_project_root(), 'deploy', 'prometheus', 'rules', '*.yml'))}]",
             "scrape_configs:", "  - job_name: tidemq-broker", "    static_configs:"]
    for b in st["brokers"]:
        target = b["admin"].split("//", 1)[1]
        lines.append(f"      - targets: [\"{target}\"]")
        lines.append(f"        labels: {{cluster: {st['cluster']}, group: {b['group']}}}")
    # the name servers' /metrics: master presence per group, the ZooKeeper session
    lines += ["  - job_name: tidemq-namesrv", "    static_configs:"]
    for n in st["namesrvs"]:
        target = n["http"].split("//", 1)[1]
        lines.append(f"      - targets: [\"{target}\"]")
        lines.append(f"        labels: {{cluster: {st['cluster']}}}")
    path = os.path.join(st["dir"], "prometheus.yml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    st["prometheus_config"] = path


# -- status ----------------------------------------------------------------------------------
def status(directory: str) -> dict:
    d = os.path.abspath(os.path.expanduser(directory))
    st = _load(d)
    view = (_view(st).get("groups") or {}) if st["namesrvs"] else {}
    brokers = []
    for b in st["brokers"]:
        g = view.get(b["group"]) or {}
        role = ("MASTER" if g.get("master") == b["name"] else "SLAVE") if g.get("master") else "NONE"
        brokers.append({"name": b["name"], "group": b["group"], "broker_id": b["broker_id"],
                        "addr": b["addr"], "admin": b["admin"], "alive": _alive(b, d),
                        "role": role if _alive(b, d) else "DOWN", "epoch": g.get("epoch"),
                        "in_sync": b["name"] in (g.get("in_sync") or ())})
    namesrv_addr = ";".join(n["addr"] for n in st["namesrvs"])
    return {"dir": d, "cluster": st["cluster"], "namesrv_addr": namesrv_addr,
            "zookeeper": st.get("zk_hosts", ""),
            "namesrvs": [{"name": n["name"], "addr": n["addr"], "http": n["http"],
                          "alive": _alive(n, d)} for n in st["namesrvs"]],
            "zk_nodes": [{"name": z["name"], "client_port": z["client_port"],
                          "alive": _alive(z, d)} for z in st["zookeeper"]],
            "brokers": brokers, "prometheus_config": st.get("prometheus_config"),
            "groups": {name: {"master": g.get("master"), "epoch": g.get("epoch"),
                              "in_sync": g.get("in_sync")} for name, g in sorted(view.items())}}


# -- restart ---------------------------------------------------------------------------------
def restart(directory: str, node: str, timeout_s: float = 120.0) -> dict:
    """Start NODE again with its recorded command (same ports, data, settings)."""
    d = os.path.abspath(os.path.expanduser(directory))
    st = _load(d)
    procs = {p["name"]: p for p in _procs(st)}
    p = procs.get(node)
    if p is None:
        raise LaunchError(f"no node {node!r} in {d}; nodes: {', '.join(sorted(procs))}")
    if _alive(p, d):
        raise LaunchError(f"{node} is running (pid {p['pid']}); stop it first to restart it")
    p.update(_spawn(d, node, p["cmd"]))
    _save(d, st)
    if node.startswith("zk-"):
        _wait(lambda: _zk_serving(p["client_port"]), timeout_s, f"{node} serving", st)
    else:
        ready = NAMESRV_READY if node.startswith("namesrv") else BROKER_READY
        start = os.path.getsize(p["log"]) if os.path.exists(p["log"]) else 0
        _wait(lambda: _ready(p, ready, start), timeout_s, f"{node} ready", st)
    return status(d)


# -- down ------------------------------------------------------------------------------------
def down(directory: str, purge: bool = False) -> dict:
    d = os.path.abspath(os.path.expanduser(directory))
    st = _load(d)
    stopped = _stop_all(st)
    if purge:
        shutil.rmtree(d, ignore_errors=True)
    return {"dir": d, "stopped": stopped, "purged": purge}


def _stop_all(st) -> list[str]:
    stopped = []
    for batch in (st["brokers"], st["namesrvs"], st["zookeeper"]):
        live = [p for p in batch if _alive(p, st["dir"])]
        for p in live:
            _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in live:
            while _alive(p, st["dir"]) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(p, st["dir"]):
                _signal(p, signal.SIGKILL)
            stopped.append(p["name"])
    return stopped


def _signal(p: dict, sig) -> None:
    try:
        os.kill(p["pid"], sig)
    except ProcessLookupError:
        pass


def _alive(p: dict, d: str | None) -> bool:
    """The pid runs (not a zombie) and, when `d` is given, still works in d (every process
    `up` starts runs there): a recycled pid is someone else's and left alone."""
    try:
        with open(f"/proc/{p['pid']}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                _reap(p["pid"])
                return False
        if d is None:
            return True
        return os.readlink(f"/proc/{p['pid']}/cwd") == d
    except (OSError, IndexError):
        return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)   # our own child (the `up` process): collect it
    except ChildProcessError:
        pass


def _procs(st) -> list[dict]:
    return st["brokers"] + st["namesrvs"] + st["zookeeper"]


def _tail(path: str, n: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def _load(d: str) -> dict:
    try:
        with open(os.path.join(d, STATE)) as f:
            return json.load(f)
    except FileNotFoundError:
        raise LaunchError(f"no cluster state in {d} (start one with `tidemq cluster up "
                          f"--dir {d}`)") from None


def _save(d: str, st: dict) -> None:
    tmp = os.path.join(d, STATE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(st, f, indent=2)
    os.replace(tmp, os.path.join(d, STATE))
