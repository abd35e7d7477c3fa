"""The deployment files validate offline with the tools a deployer would use, and every broker
they start loads as a valid TideMQ config (the keys exist, the values pass validation)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

import pytest
import yaml

from tests.ops.cli_proc import cli_wrapper
from tests.ops.tools import DEPLOY, ROOT, run, tool
from tidemq.node.config import load_config

COMPOSE = os.path.join(ROOT, "docker-compose.yml")
K8S = os.path.join(DEPLOY, "k8s")


def test_compose_passes_docker_compose_config():
    run([tool("docker-compose"), "-f", COMPOSE, "config", "-q"])


def test_compose_passes_the_compose_spec_schema():
    run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", COMPOSE])


def test_compose_topology():
    doc = yaml.safe_load(open(COMPOSE))
    services = doc["services"]
    assert {"zk-1", "zk-2", "zk-3", "namesrv-0", "namesrv-1", "broker-a-0", "broker-a-1",
            "broker-b-0", "broker-b-1", "prometheus", "grafana"} <= set(services)
    host_ports = [p.split(":")[0] for s in services.values() for p in s.get("ports", [])]
    assert len(host_ports) == len(set(host_ports)), "a host port is published twice"
    scraped = yaml.safe_load(open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")))
    targets = {t.split(":")[0] for job in scraped["scrape_configs"]
               for sc in job.get("static_configs", []) for t in sc["targets"]}
    assert {s for s in services if s.startswith(("broker-", "namesrv-"))} <= targets


def test_compose_brokers_load_as_valid_configs(tmp_path):
    """Each broker service's command, run through the real config loader (paths inside the
    container replaced by temporary ones)."""
    doc = yaml.safe_load(open(COMPOSE))
    secret = tmp_path / "secret"
    secret.write_text("x" * 32)
    toml_text = open(os.path.join(DEPLOY, "compose", "broker.toml")).read()
    toml_text = toml_text.replace("/run/secrets/tidemq_ha_secret", str(secret))
    toml_text = _local_secret_files(toml_text, r"/run/secrets/\w+", tmp_path)
    toml_text = toml_text.replace("/var/lib/tidemq/store", str(tmp_path / "store"))
    conf = tmp_path / "broker.toml"
    conf.write_text(toml_text)
    seen = set()
    for name, svc in doc["services"].items():
        if not name.startswith("broker-"):
            continue
        args = svc["command"]
        assert args[:3] == ["broker", "-c", "/etc/tidemq/broker.toml"]
        # compose's ${VAR:-default} interpolation, with VAR unset
        overrides = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", args[i + 1])
                     for i, a in enumerate(args) if a == "--set"]
        cfg = load_config(str(conf), overrides)
        assert cfg.ha.role == "cluster" and not cfg.standalone
        assert cfg.ha.node_id == name and cfg.ha.listen_host == name
        # routes name an address a CLI on the Docker host reaches: the published remoting port
        published = {int(p.split(":")[1]): int(p.split(":")[0]) for p in svc["ports"]}
        assert cfg.advertised_addr(cfg.listen_port) == ("127.0.0.1", published[cfg.listen_port])
        seen.add((cfg.broker_name, cfg.broker_id))
    assert seen == {("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)}


def _local_secret_files(toml_text: str, pattern: str, tmp_path) -> str:
    """Paths of mounted secret files (ZooKeeper TLS and credential) replaced by local stand-ins:
    the loader checks they exist and that the credential reads as user:password
    (tests/ops/test_deploy_security.py checks them with real certificates)."""
    for path in sorted(set(re.findall(pattern, toml_text))):
        local = tmp_path / ("secret-" + path.strip("/").replace("/", "-"))
        local.write_text("tidemq:password" if "auth" in path else "x")
        toml_text = toml_text.replace(f'"{path}"', f'"{local}"')
    return toml_text


def test_yaml_files_lint_clean():
    files = [COMPOSE] + [os.path.join(d, f) for d, _, fs in os.walk(DEPLOY) for f in fs
                         if f.endswith((".yml", ".yaml"))]
    config = "{extends: relaxed, rules: {line-length: {max: 160}}}"
    run([tool("yamllint"), "-d", config, "--strict", *files])


def test_k8s_files_pass_kubernetes_validate_strict():
    files = [os.path.join(K8S, f) for f in sorted(os.listdir(K8S))
             if f.endswith(".yaml") and f != "kustomization.yaml"]
    out = run([tool("kubernetes-validate"), "--strict", *files])
    assert "statefulset/broker-a" in out and "poddisruptionbudget/broker-b" in out, out


def test_k8s_kustomization_renders_and_validates(tmp_path):
    """With the secrets make-secrets.sh writes, the kustomization renders and validates;
    without them it refuses to build (no example secret can be deployed by mistake)."""
    doc = yaml.safe_load(open(os.path.join(K8S, "kustomization.yaml")))
    secret_files = {x for g in doc["secretGenerator"] for x in g["files"]}
    assert all(f.startswith("secrets/") for f in secret_files)
    kubectl = tool("kubectl", required=False)
    if kubectl is None:   # the kustomization still lists only files that exist
        for f in doc["resources"] + [x for g in doc["configMapGenerator"] for x in g["files"]]:
            assert os.path.isfile(os.path.join(K8S, f)), f
        return
    shutil.copytree(DEPLOY, tmp_path / "deploy", ignore=shutil.ignore_patterns("secrets"))
    copy = tmp_path / "deploy" / "k8s"   # its make-secrets.sh runs the compose one
    refused = subprocess.run([kubectl, "kustomize", str(copy)], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode != 0 and "secrets/" in refused.stderr
    made = subprocess.run(["bash", str(copy / "make-secrets.sh")], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, TIDEMQ=cli_wrapper(tmp_path)))
    assert made.returncode == 0, made.stderr
    assert {"secrets/" + f for f in os.listdir(copy / "secrets")} == secret_files
    assert len(open(copy / "secrets" / "ha-secret").read().strip()) == 64
    rendered = run([kubectl, "kustomize", str(copy)])
    kinds = [d["kind"] for d in yaml.safe_load_all(rendered)]
    for kind in ("Namespace", "ConfigMap", "Secret", "Service", "StatefulSet", "Deployment",
                 "PodDisruptionBudget"):
        assert kind in kinds
    run([tool("kubernetes-validate"), "--strict", "-"], stdin=rendered)


def test_k8s_brokers_load_as_valid_configs(tmp_path):
    """The StatefulSet's shell command, expanded for pod broker-b-1, through the config loader."""
    secret = tmp_path / "secret"
    secret.write_text("x" * 32)
    text = open(os.path.join(K8S, "broker.toml")).read()
    text = text.replace("/etc/tidemq/secret/ha-secret", str(secret))
    text = _local_secret_files(text, r"/etc/tidemq/zk-[\w./-]+", tmp_path)
    text = text.replace("/var/lib/tidemq/store", str(tmp_path / "store"))
    conf = tmp_path / "broker.toml"
    conf.write_text(text)
    for group in ("a", "b"):
        docs = list(yaml.safe_load_all(open(os.path.join(K8S, f"broker-{group}.yaml"))))
        sts = next(d for d in docs if d["kind"] == "StatefulSet")
        pod = sts["spec"]["template"]
        container = pod["spec"]["containers"][0]
        script = container["args"][0]
        env = {"POD_NAME": f"broker-{group}-1", "POD_IP": "10.0.0.7", "POD_NAMESPACE": "mq"}
        script = re.sub(r"\$\{POD_NAME##\*-\}", "1", script)
        script = re.sub(r"\$\{(\w+)\}", lambda m, env=env: env[m.group(1)], script)
        args = shlex.split(script)
        assert args[:5] == ["exec", "tidemq", "broker", "-c", "/etc/tidemq/broker.toml"]
        overrides = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
        cfg = load_config(str(conf), overrides)
        assert (cfg.broker_name, cfg.broker_id, cfg.ha.node_id) == (
            f"broker-{group}", 1, f"broker-{group}-1")
        # slaves dial the master's stable pod DNS name (headless Service), not a pod IP
        assert cfg.ha.advertised_host == f"broker-{group}-1.broker-{group}-hs.mq.svc.cluster.local"
        assert f"broker-{group}-hs" in {d["metadata"]["name"] for d in docs
                                         if d["kind"] == "Service"}
        # probes and scrape annotations point at the admin port the config opens
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["admin"] == cfg.admin_port and ports["remoting"] == cfg.listen_port
        assert ports["ha"] == cfg.ha.listen_port
        assert container["readinessProbe"]["httpGet"]["port"] == "admin"
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(cfg.admin_port)
        assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "store"


def test_prometheus_configs_and_rules_pass_promtool(tmp_path):
    promtool = tool("promtool")
    run([promtool, "check", "config", "prometheus.yml"], cwd=os.path.join(DEPLOY, "prometheus"))
    run([promtool, "check", "rules", os.path.join(DEPLOY, "prometheus", "rules",
                                                   "tidemq-alerts.yml")])
    # Debian's Prometheus is built without Kubernetes discovery: check the k8s scrape config
    # (relabelling included) with its discovery block swapped for a static target.
    doc = yaml.safe_load(open(os.path.join(K8S, "prometheus-scrape.yml")))
    for job in doc["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs")[0]["role"] == "pod"
        job["static_configs"] = [{"targets": ["10.0.0.7:10913"]}]
    doc["rule_files"] = [os.path.join(DEPLOY, "prometheus", "rules", "*.yml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(doc))
    run([promtool, "check", "config", str(path)])


def test_alert_rule_unit_tests_pass():
    out = run([tool("promtool"), "test", "rules", "tidemq-alerts.test.yml"],
              cwd=os.path.join(DEPLOY, "prometheus", "tests"))
    assert "SUCCESS" in out


@pytest.mark.parametrize("alert", [
    "TideMQGroupWithoutMaster", "TideMQInSyncBelowMinimum", "TideMQReplicationLagSeconds",
    "TideMQReplicationLagBytes", "TideMQConsumerLagGrowing", "TideMQDiskAboveCleanRatio",
    "TideMQDiskAboveWarningRatio", "TideMQFlushDiskTimeouts", "TideMQFlushSlaveTimeouts",
    "TideMQZooKeeperSessionLost", "TideMQTlsCertificateExpiresSoon",
    "TideMQTlsCertificateExpired", "TideMQDiskFullWritesRefused",
    "TideMQUnconsumedMessagesDeleted", "TideMQUndeliverableParked"])
def test_every_required_alert_exists_and_is_unit_tested(alert):
    rules = yaml.safe_load(open(os.path.join(DEPLOY, "prometheus", "rules", "tidemq-alerts.yml")))
    names = {r.get("alert") for g in rules["groups"] for r in g["rules"]}
    assert alert in names
    tests = yaml.safe_load(open(os.path.join(DEPLOY, "prometheus", "tests",
                                             "tidemq-alerts.test.yml")))
    fired = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]
             if t.get("exp_alerts")}
    assert alert in fired, f"{alert} has no unit test where it fires"


def test_dockerfile_copies_what_exists_and_runs_the_cli():
    """No Docker engine here: check what can be checked offline. Every COPY source exists,
    the package dirs the image installs are the ones pyproject.toml packages, and the ports
    it exposes are the ones the compose file and the configs use."""
    lines = [ln.strip() for ln in open(os.path.join(ROOT, "Dockerfile")) if ln.strip()
             and not ln.lstrip().startswith("#")]
    copies = [ln.split()[1:-1] for ln in lines if ln.startswith("COPY ")]
    for sources in copies:
        for src in sources:
            assert os.path.exists(os.path.join(ROOT, src)), src
    copied = {src for sources in copies for src in sources}
    setup_py = open(os.path.join(ROOT, "setup.py")).read()
    folders = re.findall(r'"tidemq[.\w]*": "(\w+)"', setup_py)
    assert "client" in folders and "node" in folders
    for folder in folders:
        assert folder in copied, f"package folder {folder} is not copied into the image"
    assert 'ENTRYPOINT ["tidemq"]' in lines
    exposed = {int(p) for ln in lines if ln.startswith("EXPOSE") for p in ln.split()[1:]}
    conf = load_config(None, ["ha.role=standalone"])
    assert {conf.listen_port, conf.admin_port, conf.ha.listen_port} <= exposed
    assert {9876, 9877} <= exposed
