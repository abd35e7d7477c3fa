"""A full disk, for real: a broker process whose store lives on a small tmpfs / ext4 file system
the test mounts, filled by producers until it refuses.

The promises checked: no acknowledged message is deleted before a consuming group consumed it
or lost (every one is read back, after a restart too); writes are refused cleanly once the
disk guard's threshold is passed (SERVICE_NOT_AVAILABLE, 14, a remark that says the disk is
full, never SYSTEM_ERROR or a traceback) and accepted again once space frees; a real ENOSPC
(the guard turned off) is answered the same way with nothing half-written; the opt-in
deletion of unconsumed data is loud and counted.
"""
import asyncio
import json
import os
import re
import time
import urllib.request

from tests.store.helpers import payload
from tests.support.broker_proc import (
    BrokerProcess,
    ha_master_settings,
    ha_secret_file,
    ha_slave_settings,
)
from tests.support.ports import free_port
from tests.support.raw_client import (
    RawClient,
    decode_records,
    properties,
    pull_ext,
    send_ext,
)
from tests.support.small_fs import small_filesystem, used_ratio, write_ballast
from tidemq.protocol.codes import RequestCode as R
from tidemq.protocol.codes import ResponseCode

from .conftest import run

MIB = 1 << 20
BODY_BYTES = 16 * 1024
QUEUES = 4
EVERY_HOUR = ";".join(f"{h:02d}" for h in range(24))
# Small files, quick disk probes, and retention as eager as it can be: every file has expired
# and every hour is a delete hour, so only the consumer rule can keep a file.
SMALL_DISK = ("store.commitlog_file_bytes=1048576", "store.max_message_bytes=262144",
              "store.consume_queue_file_units=4096", "store.index_slots=1024",
              "store.index_entries=16384", "store.derived_flush_interval_ms=200",
              "store.clean_interval_ms=500", "store.file_reserved_hours=0",
              f"store.delete_when={EVERY_HOUR}", f"default_topic_queues={QUEUES}")


class Ledger:
    """What the broker answered: acknowledged messages by (queue, queue offset), refusals."""

    def __init__(self):
        self.acked: dict[tuple[int, int], bytes] = {}
        self.refused: list[str] = []
        self.other: list[tuple[int, str]] = []
        self.seq = 0


async def _send(c, topic: str, ledger: Ledger) -> int:
    ledger.seq += 1
    body = payload(ledger.seq, BODY_BYTES)
    r = await c.request(R.SEND_MESSAGE, send_ext(topic, props=properties(keys=f"k{ledger.seq}")),
                        body, timeout=30)
    if r.code == 0:
        ledger.acked[(int(r.ext["queueId"]), int(r.ext["queueOffset"]))] = body
    elif r.code == ResponseCode.SERVICE_NOT_AVAILABLE:
        ledger.refused.append(r.remark)
    else:
        ledger.other.append((r.code, r.remark))
    return r.code


async def _produce_until_refused(addr: str, topic: str, ledger: Ledger, fast: int,
                                 deadline_s: float, slow_pause_s: float = 0.05) -> dict:
    """`fast` producers back to back and one slow one, until each has been refused a few
    times (bounded by count and time). Returns refusals per producer."""
    deadline = time.monotonic() + deadline_s
    refusals = {}

    async def producer(name: str, pause_s: float, enough: int) -> None:
        refusals[name] = 0
        async with await RawClient.connect(addr) as c:
            for _ in range(20_000):
                if refusals[name] >= enough or time.monotonic() > deadline:
                    return
                if await _send(c, topic, ledger) == ResponseCode.SERVICE_NOT_AVAILABLE:
                    refusals[name] += 1
                if pause_s:
                    await asyncio.sleep(pause_s)

    await asyncio.gather(*(producer(f"fast{i}", 0, 20) for i in range(fast)),
                         producer("slow", slow_pause_s, 3))
    return refusals


async def _commit(addr: str, group: str, topic: str, offsets: dict) -> None:
    async with await RawClient.connect(addr) as c:
        for qid, off in offsets.items():
            r = await c.request(R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic,
                                                           "queueId": qid, "commitOffset": off})
            assert r.code == 0


async def _read_queue(c, topic: str, qid: int, start: int) -> dict:
    got, offset = {}, start
    for _ in range(10_000):
        r = await c.request(R.PULL_MESSAGE, pull_ext(topic, qid, offset, group="READER",
                                                     max_nums=32))
        if r.code == ResponseCode.PULL_OFFSET_MOVED:
            offset = int(r.ext["nextBeginOffset"])
            continue
        if r.code != 0:
            return got
        for m in decode_records(r.body):
            got[m.queue_offset] = bytes(m.body)
        offset = int(r.ext["nextBeginOffset"])
    raise AssertionError("read loop did not end")


async def _check_every_ack_readable(addr: str, topic: str, ledger: Ledger,
                                    consumed: dict) -> int:
    """Every acknowledged message a group has not consumed reads back intact, each queue
    holds exactly the acknowledged messages (nothing half-written, no phantom), and consumed
    ones read back intact when still there. Returns how many consumed ones retention deleted."""
    deleted = 0
    async with await RawClient.connect(addr) as c:
        for qid in range(QUEUES):
            mine = {off: body for (q, off), body in ledger.acked.items() if q == qid}
            got = await _read_queue(c, topic, qid, 0)
            r = await c.request(R.GET_MAX_OFFSET, {"topic": topic, "queueId": qid})
            assert int(r.ext["offset"]) == len(mine), f"queue {qid}: phantom or lost messages"
            for off, body in mine.items():
                if off >= consumed.get(qid, 0):
                    assert got.get(off) == body, f"acknowledged message {qid}/{off} lost"
                elif off in got:
                    assert got[off] == body
                else:
                    deleted += 1
    return deleted


def _metric(b: BrokerProcess, name: str) -> float:
    with urllib.request.urlopen(b.admin_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert m, f"{name} not exported"
    return float(m.group(1))


def _broker(mnt: str, tmp_path, *settings) -> BrokerProcess:
    b = BrokerProcess(f"{mnt}/store", SMALL_DISK + settings, small_store=False)
    b.log_path = str(tmp_path / "broker.log")  # not on the file system the test fills
    return b


def _assert_clean_log(b: BrokerProcess) -> None:
    text = b.log_text()
    assert "Traceback" not in text, text[-3000:]
    assert "SIGBUS" not in text


def test_full_disk_refuses_writes_keeps_every_ack_and_resumes(tmp_path):
    with small_filesystem("tmpfs", 64, tmp_path) as mnt:
        ballast = f"{mnt}/ballast"
        write_ballast(ballast, 12 * MIB)
        b = _broker(mnt, tmp_path).start()
        try:
            ledger = Ledger()
            topic = "DiskFull"
            # A group consumed the first messages of each queue (about 2.5 files): retention
            # may delete those, and nothing else however eager its time rules are.
            consumed = {q: 40 for q in range(QUEUES)}
            run(_produce_n(b.addr, topic, ledger, 200))
            run(_commit(b.addr, "CG", topic, consumed))
            refusals = run(_produce_until_refused(b.addr, topic, ledger, fast=4, deadline_s=120))
            assert refusals.pop("slow") >= 3 and all(n >= 20 for n in refusals.values())
            assert ledger.other == [], ledger.other[:5]  # never SYSTEM_ERROR or anything else
            assert all("not writable: disk full" in r for r in ledger.refused), ledger.refused[:3]
            ratio = used_ratio(mnt)
            assert 0.80 < ratio < 0.97, ratio  # refused near the 90% threshold, not at ENOSPC
            assert _metric(b, "tidemq_store_disk_full") == 1
            assert _metric(b, "tidemq_store_disk_refused_messages_total") == len(ledger.refused)
            assert _metric(b, "tidemq_store_retention_unconsumed_deleted_messages_total") == 0
            # the consumed head goes at a retention pass (periodic): retention still works
            deadline = time.monotonic() + 30
            while not run(_check_every_ack_readable(b.addr, topic, ledger, consumed)):
                assert time.monotonic() < deadline, "retention deleted no consumed message"
                time.sleep(0.5)

            os.remove(ballast)  # space frees: writes resume by themselves
            assert run(_send_until_accepted(b.addr, topic, ledger, timeout_s=10)) == 0
            assert _metric(b, "tidemq_store_disk_full") == 0
            _assert_clean_log(b)
            assert "disk full:" in b.log_text() and "writes accepted again" in b.log_text()

            b.restart()
            run(_check_every_ack_readable(b.addr, topic, ledger, consumed))
        finally:
            b.stop()
            b.kill()


async def _produce_n(addr: str, topic: str, ledger: Ledger, n: int) -> None:
    async with await RawClient.connect(addr) as c:
        for _ in range(n):
            assert await _send(c, topic, ledger) == 0


async def _send_until_accepted(addr: str, topic: str, ledger: Ledger, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    async with await RawClient.connect(addr) as c:
        while True:
            code = await _send(c, topic, ledger)
            if code == 0 or time.monotonic() > deadline:
                return code
            await asyncio.sleep(0.1)


def test_real_enospc_is_answered_cleanly_and_restart_recovers(tmp_path):
    """The disk guard off (disk_warning_ratio = 1): the file system's own ENOSPC, met when
    the next commit-log file cannot be allocated, comes back as code 14; nothing is
    half-written; a broker killed afterwards recovers every acknowledged message."""
    with small_filesystem("ext4", 48, tmp_path) as mnt:
        b = _broker(mnt, tmp_path, "store.disk_warning_ratio=1", "store.disk_resume_ratio=1")
        b.start()
        try:
            ledger = Ledger()
            topic = "Enospc"
            refusals = run(_produce_until_refused(b.addr, topic, ledger, fast=3, deadline_s=120))
            assert all(n >= 3 for n in refusals.values()), refusals
            assert ledger.other == [], ledger.other[:5]
            assert all("disk full" in r and "ENOSPC" in r for r in ledger.refused), \
                ledger.refused[:3]
            assert used_ratio(mnt) > 0.95  # the file system really was full
            assert b.alive
            _assert_clean_log(b)
            run(_check_every_ack_readable(b.addr, topic, ledger, {}))
            b.kill()
            b.start()
            run(_check_every_ack_readable(b.addr, topic, ledger, {}))
            _assert_clean_log(b)
        finally:
            b.stop()
            b.kill()


def test_opt_in_deletes_unconsumed_files_loudly_and_counts_them(tmp_path):
    b = _broker(str(tmp_path), tmp_path, "store.retention_delete_unconsumed=true").start()
    try:
        ledger = Ledger()
        topic = "OptIn"
        run(_produce_n(b.addr, topic, ledger, 1))  # the topic exists: CG may commit on it
        run(_commit(b.addr, "CG", topic, {0: 1}))
        time.sleep(2.5)  # retention learns that CG consumes the topic (published every 2 s)
        run(_produce_n(b.addr, topic, ledger, 300))  # about 5 files
        deadline = time.monotonic() + 20
        while _metric(b, "tidemq_store_retention_unconsumed_deleted_files_total") < 3:
            assert time.monotonic() < deadline, b.log_text()[-3000:]
            time.sleep(0.2)
        lost = _metric(b, "tidemq_store_retention_unconsumed_deleted_messages_total")
        warnings = [line for line in b.log_text().splitlines()
                    if "holding unconsumed messages" in line]
        assert len(warnings) >= 3 and all("WARNING" in w for w in warnings), warnings
        assert "group 'CG' topic 'OptIn'" in warnings[0]
        assert "(no consumer group)" not in warnings[0]  # CG consumes the topic
        counted = sum(int(n) for w in warnings for n in re.findall(r": (\d+)", w))
        assert counted == lost > 0
    finally:
        b.stop()
        b.kill()


def test_slave_with_a_full_disk_pauses_replication_and_catches_up_once_space_frees(tmp_path):
    """A slave whose disk fills refuses the replicated bytes before writing them: it stays
    up, reports disk full once, keeps a log that is a byte-exact prefix of the master's, and
    catches up by itself once space frees."""
    secret, port = ha_secret_file(tmp_path), free_port()
    async_master = ("ha.replication_mode=ASYNC_MASTER",)
    master = BrokerProcess(str(tmp_path / "master"),
                           SMALL_DISK + ha_master_settings(secret, port, *async_master),
                           small_store=False).start()
    with small_filesystem("tmpfs", 48, tmp_path) as mnt:
        ballast = f"{mnt}/ballast"
        write_ballast(ballast, 24 * MIB)
        slave = _broker(mnt, tmp_path, *ha_slave_settings(secret, port, 1)).start()
        try:
            ledger = Ledger()
            run(_produce_n(master.addr, "SlaveFull", ledger, 1900))  # about 30 MiB
            end = _metric(master, "tidemq_store_max_offset_bytes")
            _wait(lambda: _metric(slave, "tidemq_store_disk_full") == 1, "slave disk full")
            stalled = _metric(slave, "tidemq_store_max_offset_bytes")
            assert 0 < stalled < end
            time.sleep(1.0)
            assert _metric(slave, "tidemq_store_max_offset_bytes") == stalled  # not writing
            assert slave.alive and "replication paused" in slave.log_text()
            os.remove(ballast)
            _wait(lambda: _metric(slave, "tidemq_store_max_offset_bytes") == end,
                  "slave caught up", timeout_s=60)
            assert _metric(slave, "tidemq_store_disk_full") == 0
            _assert_clean_log(slave)
            assert slave.log_text().count("replication paused") <= 3  # no flood
            assert slave.stop() == 0
            assert _log_bytes(slave.root_dir, int(end)) == _log_bytes(master.root_dir, int(end))
        finally:
            slave.stop()
            slave.kill()
            master.stop()
            master.kill()


def _wait(pred, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _log_bytes(root: str, end: int) -> bytes:
    out = bytearray()
    directory = os.path.join(root, "commitlog")
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out += f.read()
    return bytes(out[:end])


def _heartbeat(client_id: str, group: str, topic: str) -> bytes:
    return json.dumps({"clientID": client_id, "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "subscriptionDataSet": [
            {"topic": topic, "subString": "*", "tagsSet": [], "codeSet": [],
             "subVersion": "1700000000000"}]}]}).encode()


def test_a_subscribed_group_without_commits_holds_the_files(tmp_path):
    """A group that subscribes (a live member's heartbeat) and has committed nothing has
    consumed nothing: retention keeps every file although another group consumed them all,
    and deletes them once the subscriber is gone (its connection closes)."""
    b = _broker(str(tmp_path), tmp_path).start()
    try:
        ledger, topic = Ledger(), "Held"
        run(_produce_n(b.addr, topic, ledger, 1))

        async def subscribed_while_consumed():
            async with await RawClient.connect(b.addr) as c:
                r = await c.request(R.HEART_BEAT, {}, _heartbeat("10.0.0.1@sub", "SUB", topic))
                assert r.code == 0
                await _produce_n(b.addr, topic, ledger, 300)  # about 5 files
                counts = {q: len([k for k in ledger.acked if k[0] == q]) for q in range(QUEUES)}
                await _commit(b.addr, "CG", topic, counts)  # CG consumed everything
                _wait(lambda: _metric(b, "tidemq_store_retention_held_files") >= 3, "held")
                assert _metric(b, "tidemq_store_min_offset_bytes") == 0
                return counts

        counts = run(subscribed_while_consumed())
        assert "group 'SUB' has not consumed topic 'Held'" in b.log_text()
        # SUB's connection closed: it no longer subscribes and never committed.
        _wait(lambda: _metric(b, "tidemq_store_min_offset_bytes") > 0, "files deleted")
        assert _metric(b, "tidemq_store_retention_unconsumed_deleted_messages_total") == 0
        deleted = run(_check_every_ack_readable(b.addr, topic, ledger, counts))
        assert deleted > 0
    finally:
        b.stop()
        b.kill()
