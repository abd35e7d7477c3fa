"""ha.advertised_host: the HA address a master publishes for its slaves (cluster mode writes it
into the leader znode; deploy/k8s sets it to the pod's DNS name)."""
import types

import pytest

from tidemq.node.config import ConfigError, load_config
from tidemq.node.replication.service import Replication


def cfg_with(tmp_path, *overrides):
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    return load_config(None, [f"store.root_dir={tmp_path / 'store'}", "ha.role=MASTER",
                              f"ha.secret_file={secret}", *overrides])


def published(cfg, port=10912) -> str:
    # Replication.ha_addr reads only the config and the bound port.
    repl = types.SimpleNamespace(cfg=cfg, config=types.SimpleNamespace(listen_host=cfg.ha.listen_host),
                                 service=types.SimpleNamespace(listen_port=port))
    return Replication.ha_addr.fget(repl)


def test_advertised_host_is_what_slaves_are_told(tmp_path):
    dns = "broker-a-0.broker-a-hs.mq.svc.cluster.local"
    assert published(cfg_with(tmp_path)) == "127.0.0.1:10912"
    assert published(cfg_with(tmp_path, f"ha.advertised_host={dns}")) == f"{dns}:10912"
    assert published(cfg_with(tmp_path, "ha.advertised_host=fd00::7")) == "[fd00::7]:10912"


@pytest.mark.parametrize("overrides, words", [
    (("ha.listen_host=0.0.0.0",), "ha.advertised_host is required"),
    (("ha.advertised_host=a b",), "not a host name"),
    (("ha.advertised_host=" + "h" * 300,), "not a host name"),
])
def test_bad_advertised_host_is_refused(tmp_path, overrides, words):
    with pytest.raises(ConfigError) as exc:
        cfg_with(tmp_path, *overrides)
    assert words in str(exc.value)
