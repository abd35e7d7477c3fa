"""The gRPC config keys: defaults (off), ranges, and one error listing every problem."""
import pytest

from tidemq.node import config as nc


def test_grpc_is_off_by_default_and_keys_load():
    assert nc.load_config(None, []).grpc_port == -1
    cfg = nc.load_config(None, ["grpc_port=0", "grpc_fifo_groups=A,B",
                                "grpc_max_delivery_attempts=5"])
    assert (cfg.grpc_port, cfg.grpc_fifo_groups, cfg.grpc_max_delivery_attempts) == (0, "A,B", 5)


def test_bad_grpc_values_are_reported_together():
    with pytest.raises(nc.ConfigError) as info:
        nc.load_config(None, ["grpc_port=-2", "grpc_max_delivery_attempts=0",
                              "grpc_max_long_polling_ms=0", "grpc_max_inflight=-1"])
    text = str(info.value)
    for key in ("grpc_port", "grpc_max_delivery_attempts", "grpc_max_long_polling_ms",
                "grpc_max_inflight"):
        assert key in text
