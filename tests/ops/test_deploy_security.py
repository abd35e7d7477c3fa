"""ZooKeeper TLS and ACLs in the deployment files (docker-compose.yml, deploy/compose,
deploy/k8s): ZooKeeper serves clients only on its TLS port with client certificates, every
broker and name server is configured for it from mounted secret files, no secret is a literal
in an environment variable or a command line, and the compose files, with the secrets
`deploy/compose/make-secrets.sh` makes, run: a real ZooKeeper started with the compose zoo.cfg's
TLS lines refuses plaintext and certificate-less clients, and a broker configured by
deploy/compose/broker.toml connects and puts digest ACLs on what it creates; three of them form
an ensemble over peer TLS whose election port refuses uncertified peers."""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.ops.cli_proc import cli_wrapper
from tests.ops.tools import DEPLOY, ROOT, tool
from tests.support.ports import free_port
from tests.support.zookeeper import ZK_JAR, ZkNode, serving_mode
from tidemq.node.config import load_config
from tidemq.node.security.settings import zk_security

COMPOSE = os.path.join(ROOT, "docker-compose.yml")
K8S = os.path.join(DEPLOY, "k8s")
SECRET_WORDS = re.compile(r"SECRET|PASSW|TOKEN|ZK_AUTH|CREDENTIAL|_KEY$", re.IGNORECASE)


def _read(path) -> str:
    return Path(path).read_text()


def _zoo_cfg(path) -> dict:
    out = {}
    for line in _read(path).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def _assert_tls_only(cfg: dict) -> None:
    assert cfg["secureClientPort"] == "2281"
    assert "clientPort" not in cfg, "a plaintext client port is open"
    servers = [v for k, v in cfg.items() if k.startswith("server.")]
    assert len(servers) == 3 and not any(";" in v for v in servers), servers
    assert cfg["serverCnxnFactory"] == "org.apache.zookeeper.server.NettyServerCnxnFactory"
    assert cfg["ssl.clientAuth"] == "need"
    assert cfg["ssl.keyStore.type"] == cfg["ssl.trustStore.type"] == "PEM"


def _assert_zk_section(cfg, port_hosts: list[str]) -> None:
    z = cfg.zookeeper
    assert [h.rpartition(":")[2] for h in z.hosts.split(",")] == ["2281"] * 3
    assert [h.rpartition(":")[0] for h in z.hosts.split(",")] == port_hosts
    assert z.tls_enable and z.tls_ca_file and z.tls_cert_file and z.tls_key_file
    assert z.auth_file and not z.auth, "the ZooKeeper credential must come from a file"
    sec = zk_security(cfg)
    assert sec.tls and sec.auth and sec.acl() is not None and not sec.problems()


def _literal_secret_envs(container: dict) -> list[str]:
    env = container.get("environment") or container.get("env") or {}
    items = env.items() if isinstance(env, dict) else [(e["name"], e.get("value")) for e in env]
    return [k for k, v in items if SECRET_WORDS.search(k) and v is not None]


def test_compose_zookeeper_serves_tls_only_from_secret_files():
    doc = yaml.safe_load(_read(COMPOSE))
    cfg = _zoo_cfg(os.path.join(DEPLOY, "compose", "zoo.cfg"))
    _assert_tls_only(cfg)
    for name in ("zk-1", "zk-2", "zk-3"):
        svc = doc["services"][name]
        assert "./deploy/compose/zoo.cfg:/conf/zoo.cfg:ro" in svc["volumes"]
        mounted = {f"/run/secrets/{s}" for s in svc["secrets"]}
        assert {cfg["ssl.keyStore.location"], cfg["ssl.trustStore.location"]} <= mounted
        assert "2281" in " ".join(svc["healthcheck"]["test"])
        assert set(svc.get("environment", {})) == {"ZOO_MY_ID"}  # zoo.cfg, not generated


def test_compose_nodes_reach_zookeeper_over_tls_with_secrets_as_files(tmp_path):
    doc = yaml.safe_load(_read(COMPOSE))
    declared = doc["secrets"]
    toml = _read(os.path.join(DEPLOY, "compose", "broker.toml"))
    used = set(re.findall(r"/run/secrets/(\w+)", toml))
    assert {"tidemq_zk_auth", "tidemq_tls_ca", "tidemq_zk_client_cert",
            "tidemq_zk_client_key", "tidemq_ha_secret"} <= used
    for name, svc in doc["services"].items():
        for part in ("environment", "command"):
            text = str(svc.get(part, ""))
            assert "tidemq:" not in text and "TIDEMQ_ZK_AUTH" not in text, (name, part)
        assert not _literal_secret_envs(svc), name
        if name.startswith("broker-"):
            assert used <= set(svc["secrets"]), name
        if name.startswith("namesrv-"):
            args = svc["command"]
            assert args[args.index("--zk") + 1] == "zk-1:2281,zk-2:2281,zk-3:2281"
            for flag in ("--zk-tls-ca", "--zk-tls-cert", "--zk-tls-key"):
                path = args[args.index(flag) + 1]
                assert path.startswith("/run/secrets/")
                assert path.rpartition("/")[2] in svc["secrets"], (name, flag)
    for secret in used | {"zk_server_bundle"}:
        assert secret in declared and "file" in declared[secret], secret
    # the broker config, with the secret files make-secrets.sh writes, through the real loader
    files = _make_compose_secrets(tmp_path / "secrets")
    for secret, spec in declared.items():
        local = files.get(os.path.basename(spec["file"]))
        assert local, f"make-secrets.sh does not make {spec['file']}"
        toml = toml.replace(f"/run/secrets/{secret}", local)
    toml = toml.replace("/var/lib/tidemq/store", str(tmp_path / "store"))
    (tmp_path / "broker.toml").write_text(toml)
    cfg = load_config(str(tmp_path / "broker.toml"), ["broker_name=broker-a", "advertised_host=broker-a-0"])
    _assert_zk_section(cfg, ["zk-1", "zk-2", "zk-3"])


def _make_compose_secrets(out) -> dict:
    """Run deploy/compose/make-secrets.sh into `out`: {file name: path}."""
    env = dict(os.environ, TIDEMQ=cli_wrapper(out.parent))
    proc = subprocess.run(["bash", os.path.join(DEPLOY, "compose", "make-secrets.sh"), str(out)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    files = {f: str(out / f) for f in os.listdir(out)}
    assert set(files) == {"ca.pem", "client.pem", "client.key", "zk-server-bundle.pem", "zk-auth",
                          "ha-secret"}
    assert re.fullmatch(r"[0-9a-f]{64}", _read(files["ha-secret"]).strip())
    auth = _read(files["zk-auth"]).strip()
    assert re.fullmatch(r"tidemq:[0-9a-f]{48}", auth), "zk-auth is not user:random-password"
    assert auth not in proc.stdout + proc.stderr, "make-secrets.sh printed the credential"
    bundle = _read(files["zk-server-bundle.pem"])
    assert "BEGIN CERTIFICATE" in bundle and "BEGIN PRIVATE KEY" in bundle  # ZooKeeper's PEM store
    sans = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName"],
                          input=bundle, capture_output=True, text=True, check=True).stdout
    assert all(f"DNS:{h}" in sans for h in ("zk-1", "zk-2", "zk-3")), sans
    again = subprocess.run(["bash", os.path.join(DEPLOY, "compose", "make-secrets.sh"), str(out)],
                           env=env, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode != 0 and _read(files["zk-auth"]).strip() == auth  # no overwrite
    return files


def test_k8s_zookeeper_and_nodes_use_tls_and_acls_from_secrets(tmp_path):
    kust = yaml.safe_load(_read(os.path.join(K8S, "kustomization.yaml")))
    assert {"name": "tidemq-zk-config", "files": ["zoo.cfg"]} in kust["configMapGenerator"]
    zoo = _zoo_cfg(os.path.join(K8S, "zoo.cfg"))
    _assert_tls_only(zoo)
    docs = {}
    for f in ("zookeeper.yaml", "namesrv.yaml", "broker-a.yaml", "broker-b.yaml"):
        for d in yaml.safe_load_all(_read(os.path.join(K8S, f))):
            docs[(d["kind"], d["metadata"]["name"])] = d
    generated = {g["name"]: g["files"] for g in kust["secretGenerator"]}
    assert generated["tidemq-zk-auth"] == ["secrets/zk-auth"]
    assert set(generated) == {"tidemq-ha-secret", "tidemq-zk-auth", "tidemq-zk-server-tls",
                              "tidemq-zk-client-tls"}
    zk = docs[("StatefulSet", "zk")]["spec"]["template"]["spec"]
    c = zk["containers"][0]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/conf/zoo.cfg"]["subPath"] == "zoo.cfg"
    vols = {v["name"]: v for v in zk["volumes"]}
    assert vols[mounts["/conf/zoo.cfg"]["name"]]["configMap"]["name"] == "tidemq-zk-config"
    tls_dir = os.path.dirname(zoo["ssl.keyStore.location"])
    assert os.path.dirname(zoo["ssl.trustStore.location"]) == tls_dir
    assert vols[mounts[tls_dir]["name"]]["secret"]["secretName"] == "tidemq-zk-server-tls"
    assert [p["containerPort"] for p in c["ports"] if p["name"] == "client-tls"] == [2281]
    svc_ports = [p["port"] for p in docs[("Service", "zk")]["spec"]["ports"]]
    assert svc_ports == [2281], "the zk Service still offers a plaintext port"
    assert not _literal_secret_envs(c)

    # brokers: broker.toml points at files mounted from the Secrets
    toml = _read(os.path.join(K8S, "broker.toml"))
    for group in ("a", "b"):
        pod = docs[("StatefulSet", f"broker-{group}")]["spec"]["template"]["spec"]
        bc = pod["containers"][0]
        assert not _literal_secret_envs(bc)
        secret_of = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        at = {m["mountPath"]: secret_of.get(m["name"]) for m in bc["volumeMounts"]}
        assert at["/etc/tidemq/zk-tls"] == "tidemq-zk-client-tls"
        assert at["/etc/tidemq/zk-auth"] == "tidemq-zk-auth"
    for path in re.findall(r'"(/etc/tidemq/zk-[\w./-]+)"', toml):
        assert os.path.dirname(path) in ("/etc/tidemq/zk-tls", "/etc/tidemq/zk-auth"), path
    files = {"/etc/tidemq/zk-tls/ca.pem": "ca", "/etc/tidemq/zk-tls/client.pem": "cert",
             "/etc/tidemq/zk-tls/client.key": "key", "/etc/tidemq/zk-auth/zk-auth": "tidemq:pw",
             "/etc/tidemq/secret/ha-secret": "x" * 32}
    for path, content in files.items():
        local = tmp_path / os.path.basename(path)
        local.write_text(content)
        toml = toml.replace(path, str(local))
    toml = toml.replace("/var/lib/tidemq/store", str(tmp_path / "store"))
    (tmp_path / "broker.toml").write_text(toml)
    cfg = load_config(str(tmp_path / "broker.toml"), ["broker_name=broker-a", "advertised_host=broker-a-0"])
    _assert_zk_section(cfg, ["zk-0.zk-hs", "zk-1.zk-hs", "zk-2.zk-hs"])

    # name servers: TLS flags to files of the client Secret, readable through fsGroup
    ns = docs[("Deployment", "tidemq-namesrv")]["spec"]["template"]["spec"]
    nc = ns["containers"][0]
    args = nc["args"]
    assert args[args.index("--zk") + 1] == "zk:2281"
    ns_mounts = {m["mountPath"]: m["name"] for m in nc["volumeMounts"]}
    ns_secrets = {v["name"]: v["secret"]["secretName"] for v in ns["volumes"]}
    for flag in ("--zk-tls-ca", "--zk-tls-cert", "--zk-tls-key"):
        d = os.path.dirname(args[args.index(flag) + 1])
        assert ns_secrets[ns_mounts[d]] == "tidemq-zk-client-tls", flag
    assert ns["securityContext"]["fsGroup"] == ns["securityContext"]["runAsUser"]
    assert not _literal_secret_envs(nc)


@pytest.mark.skipif(not os.path.exists(ZK_JAR), reason="Debian's zookeeper package is missing")
def test_compose_zoo_cfg_tls_lines_run_on_a_real_zookeeper(tmp_path):
    """The compose zoo.cfg (ensemble lines and paths swapped for a local standalone node) on
    Debian's ZooKeeper, with make-secrets.sh's files: plaintext and certificate-less clients get
    no session; the broker configured by deploy/compose/broker.toml connects, and what it creates
    carries its digest ACL (a stranger with a certificate reads but cannot write)."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError
    from kazoo.handlers.threading import KazooTimeoutError

    tool("openssl")
    files = _make_compose_secrets(tmp_path / "secrets")
    node = ZkNode(str(tmp_path / "zk"), 1, free_port(), [])
    node.tls = True                                   # Netty's codec on the class path
    secure = free_port()
    local = {"/run/secrets/zk_server_bundle": files["zk-server-bundle.pem"],
             "/run/secrets/tidemq_tls_ca": files["ca.pem"]}
    lines = []
    for k, v in _zoo_cfg(os.path.join(DEPLOY, "compose", "zoo.cfg")).items():
        if k.startswith("server.") or k in ("dataDir", "tickTime"):
            continue
        lines.append(f"{k}={local.get(v, str(secure) if k == 'secureClientPort' else v)}")
    lines += [f"dataDir={node.dir}/data", "tickTime=200", f"clientPort={node.client_port}",
              "clientPortAddress=127.0.0.1", "secureClientPortAddress=127.0.0.1"]
    with open(node.cfg, "w") as f:
        f.write("\n".join(lines) + "\n")
    node.start()
    try:
        deadline = time.monotonic() + 60
        while serving_mode(node.client_port) is None:
            assert time.monotonic() < deadline, node.log_tail()
            time.sleep(0.2)
        hosts = f"127.0.0.1:{secure}"
        toml = _read(os.path.join(DEPLOY, "compose", "broker.toml"))
        for name, path in (("tidemq_tls_ca", "ca.pem"), ("tidemq_zk_client_cert", "client.pem"),
                           ("tidemq_zk_client_key", "client.key"), ("tidemq_zk_auth", "zk-auth")):
            toml = toml.replace(f"/run/secrets/{name}", files[path])
        (tmp_path / "ha").write_text("x" * 32)
        toml = toml.replace("/run/secrets/tidemq_ha_secret", str(tmp_path / "ha"))
        toml = toml.replace("/var/lib/tidemq/store", str(tmp_path / "store"))
        (tmp_path / "broker.toml").write_text(toml)
        sec = zk_security(load_config(str(tmp_path / "broker.toml"), ["advertised_host=broker-a-0"]))

        for kw in ({}, {"use_ssl": True, "ca": files["ca.pem"]}):   # plaintext, no certificate
            zk = KazooClient(hosts=hosts, timeout=2, **kw)
            with pytest.raises(KazooTimeoutError):    # never gets a session
                zk.start(timeout=3)
            zk.stop()
            zk.close()
        broker = KazooClient(hosts=hosts, timeout=5, **sec.kazoo_kwargs())
        stranger = KazooClient(hosts=hosts, timeout=5, use_ssl=True, ca=files["ca.pem"],
                               certfile=files["client.pem"], keyfile=files["client.key"])
        broker.start(timeout=15)
        stranger.start(timeout=15)
        try:
            broker.create("/tidemq-deploy-check/state", b"epoch=1", makepath=True)
            acl, _ = broker.get_acls("/tidemq-deploy-check/state")
            assert sorted(a.id.scheme for a in acl) == ["digest", "world"], acl
            assert stranger.get("/tidemq-deploy-check/state")[0] == b"epoch=1"  # world READ
            with pytest.raises(NoAuthError):
                stranger.set("/tidemq-deploy-check/state", b"epoch=99")
            with pytest.raises(NoAuthError):
                stranger.delete("/tidemq-deploy-check/state")
            assert broker.get("/tidemq-deploy-check/state")[0] == b"epoch=1"
        finally:
            for zk in (broker, stranger):
                zk.stop()
                zk.close()
    finally:
        node.stop()


def _quorum_tls_lines(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k == "sslQuorum" or k.startswith("ssl.quorum.")}


def test_compose_and_k8s_zookeeper_peers_use_tls():
    """Both deployments carry the same peer TLS settings, from their own secret paths."""
    compose = _quorum_tls_lines(_zoo_cfg(os.path.join(DEPLOY, "compose", "zoo.cfg")))
    k8s = _quorum_tls_lines(_zoo_cfg(os.path.join(K8S, "zoo.cfg")))
    assert compose["sslQuorum"] == "true" and compose["ssl.quorum.clientAuth"] == "need"
    paths = ("ssl.quorum.keyStore.location", "ssl.quorum.trustStore.location")
    assert {k: v for k, v in compose.items() if k not in paths} == \
        {k: v for k, v in k8s.items() if k not in paths}
    full = _zoo_cfg(os.path.join(DEPLOY, "compose", "zoo.cfg"))
    assert compose["ssl.quorum.keyStore.location"] == full["ssl.keyStore.location"]
    assert compose["ssl.quorum.trustStore.location"] == full["ssl.trustStore.location"]


def _election_port_answer(port: int, ca: str, cert: str | None, key: str | None) -> str:
    """Dial a ZooKeeper election port over TLS: "held" when the handshake passes and the server
    waits for the peer's greeting, else what ended the connection."""
    import socket
    import ssl
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.settimeout(0.3)  # ZooKeeper drops a silent peer after about a second
                data = tls.recv(1)  # TLS 1.3: a refused client certificate surfaces here
                return "closed" if not data else "data"
        except TimeoutError:
            return "held"
        except (ssl.SSLError, ConnectionError) as exc:
            return f"refused: {exc}"


@pytest.mark.skipif(not os.path.exists(ZK_JAR), reason="Debian's zookeeper package is missing")
def test_compose_zoo_cfg_peer_tls_forms_an_ensemble_that_refuses_uncertified_peers(tmp_path):
    """Three Debian ZooKeepers with the compose zoo.cfg's TLS lines (client and peer) and
    make-secrets.sh's files elect a leader over TLS; their election port completes a handshake
    only for a peer with a certificate from the CA, and drops plaintext."""
    import socket

    tool("openssl")
    files = _make_compose_secrets(tmp_path / "secrets")
    local = {"/run/secrets/zk_server_bundle": files["zk-server-bundle.pem"],
             "/run/secrets/tidemq_tls_ca": files["ca.pem"]}
    ports = [(free_port(), free_port(), free_port(), free_port()) for _ in range(3)]
    servers = [f"server.{i + 1}=127.0.0.1:{p[1]}:{p[2]}" for i, p in enumerate(ports)]
    nodes = []
    for i, (client, _, _, secure) in enumerate(ports):
        node = ZkNode(str(tmp_path / "zk"), i + 1, client, servers)
        node.tls = True                               # Netty's codec on the class path
        lines = [f"{k}={local.get(v, str(secure) if k == 'secureClientPort' else v)}"
                 for k, v in _zoo_cfg(os.path.join(DEPLOY, "compose", "zoo.cfg")).items()
                 if not k.startswith("server.") and k not in ("dataDir", "tickTime")]
        lines += servers + [f"dataDir={node.dir}/data", "tickTime=200",
                            f"clientPort={client}", "clientPortAddress=127.0.0.1",
                            "secureClientPortAddress=127.0.0.1"]
        with open(node.cfg, "w") as f:
            f.write("\n".join(lines) + "\n")
        nodes.append(node)
    for node in nodes:
        node.start()
    try:
        deadline = time.monotonic() + 90
        while sorted(str(serving_mode(n.client_port)) for n in nodes) != \
                ["follower", "follower", "leader"]:
            assert time.monotonic() < deadline, "\n".join(n.log_tail() for n in nodes)
            time.sleep(0.3)
        election = ports[0][2]
        ca = files["ca.pem"]
        assert _election_port_answer(election, ca, files["client.pem"], files["client.key"]) == "held"
        refused = _election_port_answer(election, ca, None, None)    # no certificate
        assert refused.startswith("refused"), refused
        with socket.create_connection(("127.0.0.1", election), timeout=5) as raw:   # plaintext
            raw.settimeout(5)
            raw.sendall(b"\x00" * 64)
            try:
                assert raw.recv(1) == b""
            except ConnectionError:
                pass
    finally:
        for node in nodes:
            node.stop()
