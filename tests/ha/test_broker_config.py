"""The [ha] config table: roles, the secret from a file or the environment (never echoed), and
every problem reported at once."""
import pytest

from tidemq.node.config import ConfigError, describe, load_config
from tidemq.node.replication.service import build_ha_config, read_secret, store_config

SECRET = "a-cluster-secret-for-the-tests-0123"


def problems(*overrides, env=None, monkeypatch=None):
    with pytest.raises(ConfigError) as e:
        load_config(None, list(overrides))
    return e.value.problems


def test_standalone_needs_no_secret_and_keeps_local_confirmation():
    cfg = load_config(None, [])
    assert cfg.ha.role == "standalone" and store_config(cfg).confirm_mode == "local"


def test_master_from_a_secret_file(tmp_path):
    f = tmp_path / "secret"
    f.write_text(SECRET + "\n")
    cfg = load_config(None, ["ha.role=MASTER", f"ha.secret_file={f}",
                             "ha.replication_mode=ASYNC_MASTER", "ha.min_in_sync_replicas=2"])
    assert read_secret(cfg.ha) == SECRET.encode()        # the trailing newline is not part
    ha = build_ha_config(cfg, read_secret(cfg.ha))
    assert ha.node_id == "0" and ha.cluster == "DefaultCluster/broker-a"
    assert ha.replication_mode == "ASYNC_MASTER" and ha.min_in_sync_replicas == 2
    assert SECRET not in repr(ha)
    assert store_config(cfg).confirm_mode == "external"


def test_slave_from_the_environment(monkeypatch):
    monkeypatch.setenv("MY_HA_SECRET", SECRET)
    cfg = load_config(None, ["ha.role=SLAVE", "broker_id=2", "ha.secret_env=MY_HA_SECRET",
                             "ha.master_addr=127.0.0.1:10912"])
    assert read_secret(cfg.ha) == SECRET.encode()
    assert build_ha_config(cfg, read_secret(cfg.ha)).node_id == "2"


def test_every_problem_at_once_and_no_secret_in_them(tmp_path, monkeypatch):
    short = tmp_path / "short"
    short.write_text("tooshort")
    p = problems("ha.role=SLAVE", "broker_id=0", f"ha.secret_file={short}",
                 "ha.master_addr=nowhere", "ha.min_in_sync_replicas=0",
                 "ha.replication_mode=SOMETIMES")
    text = "\n".join(p)
    assert "broker_id > 0" in text and "master_addr" in text
    assert "at least 16 bytes" in text and "tooshort" not in text
    assert "min_in_sync_replicas" in text and "SOMETIMES" in text
    monkeypatch.delenv("TIDEMQ_HA_SECRET", raising=False)
    assert any("no HA secret" in x for x in problems("ha.role=MASTER"))
    assert any("ha.role" in x for x in problems("ha.role=LEADER"))
    assert any("cannot read ha.secret_file" in x
               for x in problems("ha.role=MASTER", f"ha.secret_file={tmp_path / 'missing'}"))


def test_describe_lists_the_ha_keys():
    table = describe()
    for key in ("ha.role", "ha.secret_file", "ha.listen_port", "ha.master_addr",
                "ha.replication_mode", "ha.slave_timeout_ms", "ha.min_in_sync_replicas"):
        assert f"`{key}`" in table
