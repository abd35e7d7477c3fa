"""The real `tidemq` command against a real broker process: exact consume counts, peeking,
queue/offset targeting, bodies from arguments, files and stdin, exit codes, quiet pipes,
one-line errors with hints, help text and output formats."""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time

from tests.ops.cli_proc import tidemq
from tests.support.broker_proc import REPO_ROOT, BrokerProcess
from tidemq.cli.main import build_parser


def _committed(addr, group, topic) -> int:
    _, progress, _ = tidemq("-b", addr, "consumer", "progress", group, "--topic", topic)
    return sum(max(r["consumer_offset"], 0) for r in progress["queues"])


def test_consume_stops_at_exactly_count_and_peek_commits_nothing(broker):
    b, topic = broker.addr, "CliExact"
    tidemq("-b", b, "topic", "create", topic, "--queues", "2")
    lines = "".join(f"m{i}\n" for i in range(20))
    _, sent, _ = tidemq("-b", b, "produce", topic, "--stdin", stdin=lines)
    assert sent["sent"] == 20 and sent["requested"] == 20
    rc, out, _ = tidemq("-b", b, "consume", topic, "g-exact", "--count", "2", "--print",
                        "--from-beginning", "-o", "json")
    assert rc == 0 and out["received"] == 2
    assert _committed(b, "g-exact", topic) == 2
    _, peeked, _ = tidemq("-b", b, "consume", topic, "g-exact", "--peek", "--count", "5",
                          "--print", "-o", "json")
    assert peeked["received"] == 5 and peeked["committed"] is False
    assert _committed(b, "g-exact", topic) == 2
    # the peek started at g-exact's committed offsets: none of the two consumed ones again
    rc, again, _ = tidemq("-b", b, "consume", topic, "g-exact", "--peek", "--count", "19",
                          "--timeout", "3", ok=False)
    assert rc == 3 and again["received"] == 18
    proc = subprocess.run([sys.executable, "-m", "tidemq.cli.main", "-b", b, "consume", topic,
                           "--peek", "--queue", "1", "--offset", "3", "--count", "1", "--print"],
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
                          env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert '"queue_id": 1' in first and '"queue_offset": 3' in first
    _, got, _ = tidemq("-b", b, "message", "get", "--topic", topic, "--queue", "0", "--offset", "0")
    assert got["messages"][0]["queue_id"] == 0 and got["messages"][0]["body"] in lines.split()


def test_consume_short_of_count_exits_3(broker):
    b, topic = broker.addr, "CliShort"
    tidemq("-b", b, "topic", "create", topic, "--queues", "1")
    tidemq("-b", b, "produce", topic, "--body", "x", "--count", "3")
    rc, out, err = tidemq("-b", b, "consume", topic, "g-short", "--from-beginning", "--count", "5",
                          "--timeout", "2", ok=False)
    assert rc == 3 and out["received"] == 3
    assert "received 3 of 5" in err and "Traceback" not in err
    _, unbounded, _ = tidemq("-b", b, "consume", topic, "g-short-2", "--from-beginning",
                             "--count", "3", "--timeout", "0")   # 0 = no time limit
    assert unbounded["received"] == 3


def test_pipe_into_head_is_quiet_and_commits_only_what_was_written(broker):
    b, topic = broker.addr, "CliPipe"
    tidemq("-b", b, "topic", "create", topic, "--queues", "1")
    tidemq("-b", b, "produce", topic, "--count", "3000", "--size", "50", "--batch", "50")
    script = (f"{sys.executable} -m tidemq.cli -b {b} consume {topic} g-pipe --from-beginning "
              f"--print --timeout 20 | head -2; echo \"rc=${{PIPESTATUS[0]}}\" >&2")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    assert len(proc.stdout.splitlines()) == 2
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
    assert "rc=141" in proc.stderr
    committed = _committed(b, "g-pipe", topic)
    assert 2 <= committed < 3000   # what reached the pipe, not everything pulled


def test_produce_body_file_and_key(broker, tmp_path):
    b, topic = broker.addr, "CliBody"
    tidemq("-b", b, "topic", "create", topic, "--queues", "1")
    f = tmp_path / "body.json"
    f.write_bytes(b'{"order": 42}')
    _, sent, _ = tidemq("-b", b, "produce", topic, "--body-file", str(f), "--key", "order-42")
    assert sent["sent"] == 1 and sent["bytes"] == 13
    _, found, _ = tidemq("-b", b, "message", "query", "--key", "order-42", "--topic", topic)
    assert found["found"] == 1 and found["messages"][0]["body"] == '{"order": 42}'
    rc, _, err = tidemq("-b", b, "produce", topic, "--body-file", str(tmp_path / "none"), ok=False)
    assert rc == 1 and "cannot read --body-file" in err


def test_http_port_and_bad_addresses_give_one_line_with_a_hint(broker):
    admin = f"127.0.0.1:{broker.admin_port}"
    rc, _, err = tidemq("-b", admin, "topic", "list", ok=False)
    assert rc == 1 and "looks like an HTTP port" in err and len(err.strip().splitlines()) == 1
    rc, out, err = tidemq("-b", admin, "produce", "T", "--body", "x", ok=False)
    assert rc == 3 and out["failed"] == 1 and out["maybe_stored"] == 0
    assert "HTTP port" in err and "Traceback" not in err
    rc, _, err = tidemq("-b", "127.0.0.1:1;127.0.0.1:2", "topic", "list", ok=False)
    assert rc == 1 and "nothing listens there" in err
    rc, _, err = tidemq("-b", broker.addr, "topic", "stats", "NoSuchTopic", ok=False)
    assert rc == 1 and "tidemq topic create" in err
    rc, _, err = tidemq("-b", broker.addr, "consume", "T", ok=False)
    assert rc == 1 and "--peek" in err


def test_broker_port_and_store_in_use_are_one_line(broker, tmp_path):
    clash = BrokerProcess(str(tmp_path / "other"), [f"listen_port={broker.port}"])
    for argv in (clash.command(),
                 [sys.executable, "-m", "tidemq.cli.main", "broker", "--set", "listen_port=0",
                  "--set", "admin_port=0", "--set", f"store.root_dir={broker.root_dir}"]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
                              env=dict(os.environ, PYTHONPATH=REPO_ROOT))
        assert proc.returncode == 1
        assert "Traceback" not in proc.stderr and "hint:" in proc.stderr
        assert "in use" in proc.stderr


def test_namesrv_without_the_cluster_extra_is_one_line():
    code = ("import sys; sys.modules['kazoo'] = None; from tidemq.cli.main import main; "
            "sys.exit(main(['namesrv', '--zk', '127.0.0.1:1']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("tidemq namesrv: missing Python package 'kazoo' (hint: pip "
                                   "install 'tidemq[cluster]')")


def test_version_help_and_table_output(broker):
    rc, out, _ = tidemq("--version")
    assert out.startswith("tidemq ")
    tidemq("-b", broker.addr, "topic", "create", "CliTable", "--queues", "2")
    _, text, _ = tidemq("-b", broker.addr, "-o", "table", "topic", "stats", "CliTable")
    assert "QUEUE_ID" in text and "messages: 0" in text and not text.startswith("{")


def test_every_option_has_help_text():
    missing = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, path + [name])
            elif action.option_strings and action.help in (None, "") and "-h" not in action.option_strings:
                missing.append(" ".join(path + [action.option_strings[-1]]))
            elif not action.option_strings and not action.help and action.dest != "command":
                missing.append(" ".join(path + [action.dest]))
    walk(build_parser(), ["tidemq"])
    assert missing == []


def test_follow_prints_new_messages_until_interrupted(broker):
    b, topic = broker.addr, "CliFollow"
    tidemq("-b", b, "topic", "create", topic, "--queues", "1")
    proc = subprocess.Popen([sys.executable, "-m", "tidemq.cli.main", "-b", b, "consume", topic,
                             "g-follow", "--follow", "--from-beginning", "--print", "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    try:
        time.sleep(1.0)
        tidemq("-b", b, "produce", topic, "--stdin", stdin="f1\nf2\nf3\n")
        buf, deadline = b"", time.monotonic() + 30
        while buf.count(b"\n") < 3 and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                buf += os.read(proc.stdout.fileno(), 65536)
        lines = buf.decode().splitlines()
        assert [json.loads(line)["body"] for line in lines[:3]] == ["f1", "f2", "f3"]
        assert proc.poll() is None   # --follow keeps running past the default timeout logic
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert json.loads((buf.decode() + out).strip().splitlines()[-1])["received"] == 3
    assert _committed(b, "g-follow", topic) == 3


def test_group_list_shows_known_groups_and_their_settings(broker):
    b, topic = broker.addr, "CliGroups"
    tidemq("-b", b, "topic", "create", topic, "--queues", "1")
    tidemq("-b", b, "produce", topic, "--body", "x", "--count", "2")
    tidemq("-b", b, "consume", topic, "g-listed", "--from-beginning", "--count", "2")
    _, out, _ = tidemq("-b", b, "group", "list")
    row = next(r for r in out["groups"] if r["group"] == "g-listed")
    assert row == {"group": "g-listed", "consume_enable": True, "retry_max_times": 16,
                   "retry_queues": 1}


def test_consumer_and_producer_connections_and_broker_status(broker):
    import asyncio

    from tidemq.consumer.push import PushConsumer
    from tidemq.message import Message
    from tidemq.producer.producer import Producer
    b, topic = broker.addr, "CliConns"
    tidemq("-b", b, "topic", "create", topic, "--queues", "1")

    async def main():
        c = PushConsumer("g-conn", {topic: "a || b"}, lambda msgs: None, namesrv_or_broker=b)
        p = Producer("p-conn", b)
        await c.start()
        await p.start()
        try:
            for _ in range(2):   # a producer heartbeats a broker once it has its route
                await p.send(Message(topic, b"hello"))
            consumers = await asyncio.to_thread(tidemq, "-b", b, "consumer", "connections", "g-conn")
            for _ in range(20):   # the producer's first heartbeat runs in the background
                producers = await asyncio.to_thread(tidemq, "-b", b, "producer", "connections",
                                                    "p-conn", ok=False)
                if producers[0] == 0:
                    break
                await asyncio.sleep(0.2)
        finally:
            await p.shutdown()
            await c.shutdown()
        return consumers[1], producers
    consumers, producers = asyncio.run(main())
    assert [r["language"] for r in consumers["connections"]] == ["PYTHON"]
    assert consumers["subscriptions"][topic] == "a || b"
    assert consumers["messageModel"] == "CLUSTERING"
    assert producers[0] == 0 and len(producers[1]["connections"]) == 1
    rc, _, err = tidemq("-b", b, "consumer", "connections", "g-nobody", ok=False)
    assert rc == 1 and "no consumer of group 'g-nobody'" in err
    _, status, _ = tidemq("-b", b, "brokers", "status")
    assert len(status["brokers"]) == 1 and status["brokers"][0]["addr"] == b


def test_table_rendering_expands_member_records_and_names_columns():
    from tidemq.cli.output import render
    text = render({"groups": [{"group": "a", "members": [
        {"broker_id": 0, "brokerRole": "MASTER"}, {"broker_id": 1, "brokerRole": "SLAVE"}]}]})
    lines = text.splitlines()
    assert lines[1].split() == ["GROUP", "BROKER_ID", "BROKER_ROLE"]
    assert [ln.split() for ln in lines[2:]] == [["a", "0", "MASTER"], ["a", "1", "SLAVE"]]


def test_topic_permission_update_refuses_sends_until_restored(broker):
    b, topic = broker.addr, "CliPerm"
    tidemq("-b", b, "topic", "create", topic, "--queues", "1")
    _, out, _ = tidemq("-b", b, "topic", "update", topic, "--perm", "r")
    assert out["perm"] == "r" and out["read_queues"] == 1
    rc, sent, err = tidemq("-b", b, "produce", topic, "--body", "x", ok=False)
    assert rc == 3 and sent["failed"] == 1 and "--perm rw" in err
    tidemq("-b", b, "topic", "update", topic, "--perm", "rw")
    _, sent, _ = tidemq("-b", b, "produce", topic, "--body", "x")
    assert sent["sent"] == 1


def test_dev_profile_uses_a_small_temporary_store(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "tidemq.cli.main", "broker", "--dev", "--set",
                             "listen_port=0", "--set", "admin_port=0", "--log-level", "WARNING"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT, env=env)
    try:
        ready = proc.stdout.readline()
        assert ready.startswith("TIDEMQ_BROKER_READY"), proc.stderr.read() if proc.poll() else ready
        addr = ready.split("remoting=")[1].split()[0]
        _, sent, _ = tidemq("-b", addr, "produce", "DevT", "--body", "x", "--count", "10")
        assert sent["sent"] == 10
        [store] = [p for p in tmp_path.iterdir() if p.name.startswith("tidemq-dev-")]
        used = sum(f.stat().st_blocks * 512 for f in store.rglob("*") if f.is_file())
        assert used < 100 * 1024 * 1024, used   # the default profile preallocates ~1.5 GB
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not store.exists()   # removed at a clean exit
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
