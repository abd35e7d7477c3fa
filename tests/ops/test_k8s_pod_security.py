"""Every pod the Kubernetes files start meets the "restricted" Pod Security Standard (the rules
the API server's Pod Security admission enforces, checked offline here), the namespace enforces
it, images are pinned with a pull policy, brokers have a startup probe, ZooKeeper members
spread over nodes, and the broker group files are the template's current output."""
from __future__ import annotations

import copy
import importlib.util
import os

import yaml

from tests.ops.tools import DEPLOY

K8S = os.path.join(DEPLOY, "k8s")
POD_OWNERS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def pod_specs() -> dict:
    """{"<file>/<kind>/<name>": pod spec} of every workload in deploy/k8s."""
    out = {}
    for f in sorted(os.listdir(K8S)):
        if not f.endswith(".yaml") or f == "kustomization.yaml":
            continue
        for d in yaml.safe_load_all(open(os.path.join(K8S, f))):
            if d and d["kind"] in POD_OWNERS:
                out[f"{f}/{d['kind']}/{d['metadata']['name']}"] = d["spec"]["template"]["spec"]
            elif d and d["kind"] == "Pod":
                out[f"{f}/Pod/{d['metadata']['name']}"] = d["spec"]
    return out


def restricted_violations(spec: dict) -> list[str]:
    """The restricted profile's rules (baseline included) that `spec` breaks."""
    bad = []
    pod_sc = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            bad.append(key)
    for v in spec.get("volumes") or ():
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {v['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    if (pod_sc.get("seLinuxOptions") or {}).get("type") not in (None, "", "container_t",
                                                               "container_init_t", "container_kvm_t"):
        bad.append("seLinuxOptions type")
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()):
            bad.append(f"{name}: capabilities must drop ALL")
        if set(caps.get("add") or ()) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: adds capabilities {caps['add']}")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            bad.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            bad.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost")
        if any(p.get("hostPort") for p in c.get("ports") or ()):
            bad.append(f"{name}: hostPort")
        if sc.get("procMount") not in (None, "Default"):
            bad.append(f"{name}: procMount")
    return bad


def test_every_pod_meets_the_restricted_profile():
    specs = pod_specs()
    assert {"broker-a.yaml/StatefulSet/broker-a", "broker-b.yaml/StatefulSet/broker-b",
            "namesrv.yaml/Deployment/tidemq-namesrv", "zookeeper.yaml/StatefulSet/zk"} <= set(specs)
    found = {name: restricted_violations(spec) for name, spec in specs.items()}
    assert {n: v for n, v in found.items() if v} == {}


def test_the_check_catches_what_the_profile_forbids():
    spec = copy.deepcopy(pod_specs()["broker-a.yaml/StatefulSet/broker-a"])
    spec["securityContext"].pop("seccompProfile")
    spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    spec["volumes"].append({"name": "host", "hostPath": {"path": "/var"}})
    bad = restricted_violations(spec)
    assert any("seccompProfile" in b for b in bad) and any("allowPrivilegeEscalation" in b for b in bad)
    assert any("hostPath" in b for b in bad)


def test_namespace_enforces_restricted():
    ns = yaml.safe_load(open(os.path.join(K8S, "namespace.yaml")))
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_images_pinned_probes_and_spreading():
    kust = yaml.safe_load(open(os.path.join(K8S, "kustomization.yaml")))
    assert "secret.yaml" not in kust["resources"]
    for name, spec in pod_specs().items():
        for c in spec["containers"]:
            assert not c["image"].endswith(":latest") and ":" in c["image"], (name, c["image"])
            assert c.get("imagePullPolicy") == "IfNotPresent", name
            assert "startupProbe" in c, name
            assert "initialDelaySeconds" not in c.get("livenessProbe", {}), name
        terms = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert terms[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname", name
    broker = pod_specs()["broker-a.yaml/StatefulSet/broker-a"]["containers"][0]
    # recovery of a large log may take long: the startup budget covers an hour
    probe = broker["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 3600


def test_broker_group_files_are_the_templates_current_output():
    path = os.path.join(K8S, "generate_groups.py")
    spec = importlib.util.spec_from_file_location("generate_groups", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    kust = yaml.safe_load(open(os.path.join(K8S, "kustomization.yaml")))
    groups = [f[:-5] for f in kust["resources"] if f.startswith("broker-")]
    assert groups == list(gen.DEFAULT_GROUPS)
    for group in groups:
        assert open(os.path.join(K8S, f"{group}.yaml")).read() == gen.render(group), (
            f"{group}.yaml is stale: run python deploy/k8s/generate_groups.py")
