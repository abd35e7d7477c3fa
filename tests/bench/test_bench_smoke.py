"""The benchmarks run on a clean checkout and print the JSON keys docs/benchmarks.md reports.

No figure is asserted (this machine's speed varies run to run); what could fail is a benchmark
that crashes, prints no JSON, drops a required key, reports zero, or loses sends. The raw
broker benchmark's frames are checked to carry a new UNIQ_KEY on every message: repeated keys
would measure the broker's duplicate-answer path instead of the store.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

import pytest

from bench.broker_raw_bench import FrameSource
from tests.support.broker_proc import REPO_ROOT
from tidemq.producer.send_codec import decode_batch_body
from tidemq.protocol import record as rec
from tidemq.protocol.codes import SerializeType
from tidemq.protocol.remoting import FrameDecoder

STORE_KEYS = ("async_batch_msgs_s", "sync_batch_64w_msgs_s", "sync_single_64w_msgs_s",
              "read_msgs_s", "recovery_mb_s")
E2E_KEYS = ("batch_send_msgs_s", "async_send_async_flush_msgs_s", "async_send_sync_flush_msgs_s",
            "sync_send_p99_ms_async_flush", "sync_send_p99_ms_sync_flush", "consume_msgs_s",
            "long_poll_wake_p99_ms")


def run_bench(script: str, *args: str, timeout: float = 300) -> dict:
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "bench", script), *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout[-3000:]
    return json.loads(lines[0])


def assert_positive(result: dict, keys) -> None:
    missing = [k for k in keys if k not in result]
    assert not missing, f"missing keys {missing} in {sorted(result)}"
    zero = {k: result[k] for k in keys if not (isinstance(result[k], (int, float)) and result[k] > 0)}
    assert not zero, f"non-positive figures: {zero}"


def test_store_bench_quick_prints_its_keys_and_leaves_the_store_in_dir(tmp_path):
    out = tmp_path / "store-bench"
    result = run_bench("store_bench.py", "--quick", "--dir", str(out))
    assert_positive(result, STORE_KEYS + ("calibration_loop_records_s",))
    assert isinstance(result["compiled"], bool)  # which codec path the figures are for
    written = [name for _, _, files in os.walk(out) for name in files]
    assert any(len(name) == 20 and name.isdigit() for name in written), written[:20]


def test_store_bench_keeps_every_round_and_reports_the_median_ratio(tmp_path):
    result = run_bench("store_bench.py", "--quick", "--rounds", "3", "--dir", str(tmp_path / "s"))
    rows = result["async_batch_rounds"]
    assert [row["round"] for row in rows] == [1, 2, 3]
    assert [row["first"] for row in rows] == ["loop", "store", "loop"]  # the order alternates
    for row in rows:
        assert row["loop_records_s"] > 0 and row["store_msgs_s"] > 0
        assert row["ratio"] == pytest.approx(row["store_msgs_s"] / row["loop_records_s"], abs=2e-3)
    assert result["async_batch_vs_loop_ratio"] == statistics.median(r["ratio"] for r in rows)
    assert result["async_batch_msgs_s"] == statistics.median(r["store_msgs_s"] for r in rows)
    assert result["calibration_loop_records_s"] == \
        statistics.median(r["loop_records_s"] for r in rows)


def test_e2e_bench_prints_its_keys_without_failed_sends():
    result = run_bench("e2e_bench.py", "--quick", "--seconds", "1")
    assert_positive(result, E2E_KEYS + ("calibration_echo_msgs_s", "calibration_loop_records_s",
                                        "batch_send_vs_loop_ratio"))
    assert result["async_send_async_flush_failed"] == 0
    assert result["async_send_sync_flush_failed"] == 0
    assert result["consume_count"] > 0


def _uniq_keys_in(frame_bytes: bytes, batch: bool) -> list[str]:
    keys = []
    for cmd in FrameDecoder().feed(frame_bytes):
        if not batch:
            keys.append(rec.decode_properties(cmd.ext["properties"])[rec.PROP_UNIQ_KEY])
            continue
        keys += [rec.decode_properties(props)[rec.PROP_UNIQ_KEY]
                 for _, _, props in decode_batch_body(cmd.body)]
    return keys


@pytest.mark.parametrize("batch", [0, 4])
@pytest.mark.parametrize("serialize_type", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_raw_bench_frames_never_repeat_a_uniq_key(batch, serialize_type):
    source = FrameSource(argparse.Namespace(body=1024, batch=batch), serialize_type)
    keys = _uniq_keys_in(source.take(3), batch > 0) + _uniq_keys_in(source.take(2), batch > 0)
    assert len(keys) == 5 * max(1, batch)
    assert len(set(keys)) == len(keys)
    assert all(len(k) == len(keys[0]) for k in keys)


GRPC_KEYS = ("grpc_sync_send_msgs_s", "grpc_sync_send_p99_ms", "grpc_async_send_msgs_s",
             "grpc_receive_msgs_s", "grpc_receive_call_p99_ms", "remoting_sync_send_msgs_s",
             "remoting_sync_send_p99_ms", "remoting_async_send_msgs_s", "remoting_consume_msgs_s")


def test_grpc_bench_prints_its_keys_and_receives_everything_sent():
    from tests.grpc.conftest import _require_sdk
    _require_sdk()
    result = run_bench("grpc_bench.py", "--quick", "--seconds", "1")
    assert_positive(result, GRPC_KEYS)
    assert result["grpc_async_send_failed"] == 0 and result["remoting_async_send_failed"] == 0
    assert result["grpc_receive_count"] == result["grpc_sent_total"]
    assert result["grpc_receive_duplicates"] == 0
    assert isinstance(result["compiled"], bool)


def test_codec_bench_times_both_paths_and_says_which_it_used():
    result = run_bench("codec_bench.py", "--quick", timeout=120)
    assert isinstance(result["compiled"], bool)
    functions = result["functions"]
    assert set(functions) == {"encode_into", "decode_properties", "prop_fields", "decode_batch",
                              "encode_batch_body", "decode_binary_ext", "index_entries",
                              "json_header_fields", "wire_messages", "record_views",
                              "offset_msg_ids", "queue_units"}
    for name, row in functions.items():
        assert row["pure_us"] > 0, name
        if result["compiled"]:
            assert row["compiled_us"] > 0 and row["speedup"] > 0, name
    window = result["dedup_window"]
    assert window["keys"] == 100_000 and window["batch"] == 64
    assert window["check_us"] > 0 and window["remember_us"] > 0


def test_scale_bench_ratios_are_per_round_and_their_median_is_the_headline():
    from bench.scale_bench import SPEED_KINDS, speed_figures
    found = {kind: {8: [100.0, 200.0, 50.0], 800: [90.0, 60.0, 45.0]} for kind in SPEED_KINDS}
    found["push_consume_count"] = {8: [10, 20, 30], 800: [5, 6, 7]}
    out = speed_figures(found, [8, 800])
    assert out["single_send_msgs_s_rounds_q8"] == [100, 200, 50]  # every round, both sides
    assert out["single_send_msgs_s_rounds_q800"] == [90, 60, 45]
    assert out["single_send_msgs_s_ratio_rounds_q800"] == [0.9, 0.3, 0.9]
    assert out["single_send_msgs_s_ratio_q800"] == 0.9  # not the ratio of medians (60/100)
    assert out["single_send_msgs_s_q8"] == 100 and out["single_send_msgs_s_q800"] == 60
    assert out["push_consume_count_q800"] == 18
    assert "single_send_msgs_s_ratio_q8" not in out


def test_scale_bench_runs_its_speed_phases_in_rounds_over_brokers_up_together():
    result = run_bench("scale_bench.py", "--queues", "8,800", "--rounds", "2", "--seconds", "0.5")
    assert result["rounds"] == 2
    for kind in ("single_send_msgs_s", "batch_send_msgs_s", "push_consume_msgs_s"):
        for n in (8, 800):
            rates = result[f"{kind}_rounds_q{n}"]
            assert len(rates) == 2 and all(r > 0 for r in rates), (kind, n, rates)
            assert result[f"{kind}_q{n}"] == round(statistics.median(rates))
        ratios = result[f"{kind}_ratio_rounds_q800"]
        assert len(ratios) == 2
        assert result[f"{kind}_ratio_q800"] == round(statistics.median(ratios), 3)
    for kind in ("single_send_msgs_s", "batch_send_msgs_s"):
        for n in (8, 800):
            rows = result[f"{kind}_cpu_us_rounds_q{n}"]
            assert len(rows) == 2 and all(len(r) == 4 and r[0] > 0 and r[2] > 0 for r in rows)
    assert result["populate_refused_q800"] == 0
    assert result["restart_idle_scan_bytes_q800"] == 0
    assert result["crash_scan_bytes_q800"] > 0
    assert result["checkpoint_lag_p99_s_q800"] > 0
    assert isinstance(result["compiled"], bool) and isinstance(result["compiled_dedup_table"], bool)


def test_producer_cpu_bench_prints_cpu_per_message_and_dry_costs():
    result = run_bench("producer_cpu_bench.py", "--queues", "8,800", "--rounds", "2",
                       "--seconds", "0.5")
    for n in (8, 800):
        assert len(result[f"single_send_msgs_s_rounds_q{n}"]) == 2
        rows = result[f"cpu_us_rounds_q{n}"]
        assert len(rows) == 2 and all(len(r) == 4 and r[0] > 0 and r[2] > 0 for r in rows)
        assert_positive(result, (f"client_user_us_q{n}", f"client_us_q{n}"))
    assert len(result["single_send_ratio_rounds_q800"]) == 2
    dry = run_bench("producer_cpu_bench.py", "--dry", "--queues", "8,800", "--rounds", "1")
    assert isinstance(result["compiled"], bool) and isinstance(dry["compiled"], bool)
    for n in (8, 800):
        for kind in ("send", "reply"):
            p10, median = dry[f"dry_{kind}_us_q{n}"]
            assert 0 < p10 <= median, (kind, n, p10, median)


def test_every_benchmark_that_prints_figures_says_which_build_it_measured():
    """A script printing a JSON line of figures includes build_info's fields (the compiled or
    the pure path). grpc_bench_client.py is the exception: it runs under the RocketMQ 5 SDK's
    interpreter, without tidemq, and grpc_bench.py prints its figures with the fields."""
    bench_dir = pathlib.Path(__file__).resolve().parents[2] / "bench"
    missing = [f.name for f in sorted(bench_dir.glob("*.py"))
               if f.name != "grpc_bench_client.py" and "print(json.dumps(" in f.read_text()
               and "build_fields" not in f.read_text()]
    assert missing == []
