"""The `tidemq` CLI against a real broker (in-process calls of client.cli.main)."""
import json
import os
import subprocess
import sys

from tidemq.cli.main import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_topic_produce_consume_query(broker, capsys, monkeypatch):
    b = ("-b", broker.addr)
    assert cli(capsys, *b, "topic", "create", "CliT", "--queues", "3") == {
        "created": "CliT", "read_queues": 3, "write_queues": 3}
    assert "CliT" in cli(capsys, "topic", "list", *b)["topics"]  # -b after the subcommand
    sent = cli(capsys, *b, "produce", "CliT", "--count", "300", "--size", "100", "--tag", "t1",
               "--key", "order-1")
    assert sent["sent"] == 300 and sent["failed"] == 0 and sent["msgs_s"] > 0
    batched = cli(capsys, *b, "produce", "CliT", "--count", "130", "--batch", "64")
    assert batched["sent"] == 130
    stats = cli(capsys, *b, "topic", "stats", "CliT")
    assert len(stats["queues"]) == 3 and stats["messages"] == 430
    assert all(r["min_offset"] == 0 for r in stats["queues"])
    monkeypatch.setenv("TIDEMQ_BROKER", broker.addr)  # the env fallback for -b
    got = cli(capsys, "consume", "CliT", "cli-group", "--count", "430", "--timeout", "20",
              "--from-beginning")
    assert got["received"] == 430
    again = cli(capsys, "consume", "CliT", "cli-group", "--timeout", "1")
    assert again["received"] == 0  # the group's offsets were committed
    found = cli(capsys, "message", "query", "--key", "order-1", "--topic", "CliT")
    assert found["found"] == 64 and all(m["keys"] == ["order-1"] for m in found["messages"])
    one = found["messages"][0]
    by_offset_id = cli(capsys, "message", "query", "--id", one["offset_msg_id"])
    assert by_offset_id["found"] == 1 and by_offset_id["messages"][0]["msg_id"] == one["msg_id"]
    by_uniq = cli(capsys, "message", "query", "--id", one["msg_id"], "--topic", "CliT")
    assert by_uniq["found"] == 1 and by_uniq["messages"][0]["offset_msg_id"] == one["offset_msg_id"]


def test_errors_exit_1_with_a_message(broker, capsys):
    assert main(["-b", broker.addr, "topic", "stats", "NoSuchTopic"]) == 1
    assert "NoSuchTopic" in capsys.readouterr().err
    assert main(["-b", "127.0.0.1:1", "topic", "list"]) == 1
    assert "cannot connect" in capsys.readouterr().err


def test_broker_subcommand_delegates_to_node():
    for pre in ([], ["-v"]):
        proc = subprocess.run([sys.executable, "-m", "tidemq.cli.main", *pre, "broker", "--describe-config"],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        assert "listen_port" in proc.stdout
