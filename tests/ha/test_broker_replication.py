"""HA in real broker processes (`python -m tidemq.node` with [ha] roles) over real sockets: a master
and slaves sharing a secret file, driven by the raw remoting client, read back through pulls,
/metrics and the commit-log files themselves."""
import asyncio
import os
import signal
import struct
import time
import urllib.request

from tests.support.broker_proc import (
    ha_group,
    ha_master_settings,
    ha_secret_file,
    ha_slave_settings,
)
from tests.support.ports import free_port
from tests.support.raw_client import RC, RawClient, decode_records, pull_ext, send_ext
from tidemq.protocol import record as rec
from tidemq.protocol.codes import ResponseCode

SMALL_FILES = ("store.commitlog_file_bytes=65536", "store.max_message_bytes=16384")  # ~200 a file
_HEAD = struct.Struct(">iI")


def run(coro):
    return asyncio.run(coro)


def metrics(b) -> dict[str, float]:
    text = urllib.request.urlopen(b.admin_url + "/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def wait_for(pred, timeout=20.0, what=""):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def max_offset(b) -> int:
    return int(metrics(b)["tidemq_store_max_offset_bytes"])


def confirmed(b) -> int:
    return int(metrics(b)["tidemq_store_confirmed_offset_bytes"])


def log_bytes(root: str, end: int) -> bytes:
    """The commit log's bytes [0, end) read from its files."""
    d = os.path.join(root, "commitlog")
    out = bytearray()
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out += f.read()
    return bytes(out[:end])


def log_bodies(root: str) -> list[bytes]:
    """Bodies of every complete record in the commit-log files, in log order."""
    d = os.path.join(root, "commitlog")
    bodies = []
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            buf = f.read()
        pos = 0
        while pos + 8 <= len(buf):
            size, magic = _HEAD.unpack_from(buf, pos)
            if magic not in (rec.MAGIC_V1, rec.MAGIC_V2) or size <= 0 or pos + size > len(buf):
                break
            try:
                m = rec.decode_record(buf, pos)
            except rec.RecordError:
                break  # a partial tail record
            bodies.append(bytes(m.body))
            pos += size
    return bodies


async def send_many(addr, topic, n, size=300, first=0, oneway=False, expect=(0,)):
    """n sends, 64 in flight; returns the bodies by response code."""
    c = await RawClient.connect(addr)
    by_code: dict[int, list[bytes]] = {}
    try:
        for start in range(first, first + n, 64):
            batch = []
            for i in range(start, min(first + n, start + 64)):
                body = b"m%08d-" % i + b"x" * size
                if oneway:
                    await c.oneway(RC.SEND_MESSAGE, send_ext(topic, i % 4), body)
                else:
                    batch.append((body, c.start(RC.SEND_MESSAGE, send_ext(topic, i % 4), body)))
            for body, fut in batch:
                r = await asyncio.wait_for(fut, 30)
                by_code.setdefault(r.code, []).append(body)
    finally:
        await c.close()
    if expect is not None:
        assert set(by_code) <= set(expect), {k: len(v) for k, v in by_code.items()}
    return by_code


async def pull_all(addr, topic, queues=4) -> list[bytes]:
    c = await RawClient.connect(addr)
    out = []
    try:
        for q in range(queues):
            offset = 0
            while True:
                r = await c.request(RC.PULL_MESSAGE, pull_ext(topic, q, offset, max_nums=256,
                                                              sys_flag=0))
                if r.code != 0:
                    break
                msgs = decode_records(r.body)
                out += [bytes(m.body) for m in msgs]
                offset = int(r.ext["nextBeginOffset"])
    finally:
        await c.close()
    return out


def in_sync(master, n=2):
    return metrics(master).get("tidemq_ha_in_sync_replicas", 0) >= n


# -- the tests ---------------------------------------------------------------------------------
def test_slave_files_byte_identical_to_master_after_rollover(broker_factory, tmp_path):
    master, (slave,) = ha_group(broker_factory, tmp_path, master_extra=SMALL_FILES,
                                slave_extra=SMALL_FILES)
    wait_for(lambda: in_sync(master), what="slave in sync")
    sent = run(send_many(master.addr, "Roll", 1500))[0]
    end = max_offset(master)
    assert end > 8 * 65536                                # rolled over many files
    m = metrics(master)
    assert m['tidemq_ha_slave_acked_offset_bytes{slave="1"}'] >= end   # SEND_OK => slave holds it
    wait_for(lambda: confirmed(slave) == end, what="slave confirmed")
    assert sorted(run(pull_all(slave.addr, "Roll"))) == sorted(sent)
    assert slave.stop() == 0 and master.stop() == 0
    assert log_bytes(slave.root_dir, end) == log_bytes(master.root_dir, end)
    files = sorted(os.listdir(os.path.join(master.root_dir, "commitlog")))
    for name in files[:-2]:                                # every full file, byte for byte
        with open(os.path.join(master.root_dir, "commitlog", name), "rb") as a, \
                open(os.path.join(slave.root_dir, "commitlog", name), "rb") as b:
            assert a.read() == b.read(), name


def test_empty_slave_bootstraps_the_whole_history(broker_factory, tmp_path):
    master, (slave,) = ha_group(broker_factory, tmp_path, master_extra=SMALL_FILES,
                                slave_extra=SMALL_FILES, start_slaves=False)
    sent = run(send_many(master.addr, "Boot", 1200))[0]   # alone: min_in_sync_replicas=1
    end = max_offset(master)
    assert end > 5 * 65536
    slave.start()
    wait_for(lambda: max_offset(slave) == end, what="bootstrap")
    wait_for(lambda: confirmed(slave) >= end, what="slave confirmed")
    m = metrics(slave)
    assert m["tidemq_store_min_offset_bytes"] == 0        # from the first file, not the last
    assert sorted(run(pull_all(slave.addr, "Boot"))) == sorted(sent)
    assert log_bytes(slave.root_dir, end) == log_bytes(master.root_dir, end)


def test_killed_slave_restarts_and_catches_up(broker_factory, tmp_path):
    master, (slave,) = ha_group(broker_factory, tmp_path,
                                master_extra=SMALL_FILES + ("ha.replication_mode=ASYNC_MASTER",),
                                slave_extra=SMALL_FILES)
    wait_for(lambda: in_sync(master), what="in sync")
    first = run(send_many(master.addr, "Kill", 400))[0]
    wait_for(lambda: max_offset(slave) == max_offset(master), what="slave caught up")
    slave.kill()                                          # SIGKILL
    more = run(send_many(master.addr, "Kill", 600, first=400))[0]
    end = max_offset(master)
    slave.start()
    wait_for(lambda: max_offset(slave) == end, what="restarted slave caught up")
    wait_for(lambda: confirmed(slave) >= end, what="slave confirmed")
    assert sorted(run(pull_all(slave.addr, "Kill"))) == sorted(first + more)
    assert log_bytes(slave.root_dir, end) == log_bytes(master.root_dir, end)


def test_sync_master_never_acks_what_no_in_sync_slave_holds(broker_factory, tmp_path):
    master, (slave,) = ha_group(broker_factory, tmp_path)
    wait_for(lambda: in_sync(master), what="in sync")

    async def produce_then_kill():
        c = await RawClient.connect(master.addr)
        acked = []
        # waves of 500 stay under the broker's per-connection in-flight limit (1,024), which
        # would otherwise answer SYSTEM_BUSY under load
        for wave in range(6):
            futs = []
            try:
                for i in range(wave * 500, wave * 500 + 500):
                    body = b"k%08d" % i + b"y" * 200
                    futs.append((body, c.start(RC.SEND_MESSAGE, send_ext("Ack", i % 4), body)))
                    if i % 50 == 49:
                        await asyncio.sleep(0)
            except ConnectionError:
                break
            for body, fut in futs:
                try:
                    r = await asyncio.wait_for(fut, 10)
                except (ConnectionError, TimeoutError):
                    break
                if r.code == 0:
                    acked.append(body)
                    if len(acked) == 1250:   # mid-wave: later sends are still in flight
                        os.kill(master.proc.pid, signal.SIGKILL)   # right after this ack
            if len(acked) >= 1250:
                break
        await c.close()
        return acked

    acked = run(produce_then_kill())
    master.kill()
    assert len(acked) >= 1250
    assert slave.stop() == 0
    held = set(log_bodies(slave.root_dir))
    missing = [b[:9] for b in acked if b not in held]
    assert not missing, f"{len(missing)} acknowledged messages missing on the slave: {missing[:5]}"


def test_consumers_on_a_slave_never_see_past_the_confirmed_offset(broker_factory, tmp_path):
    # Slave 2 is paused (SIGSTOP) while it is still in the in-sync set: slave 1 receives the
    # bytes, but the confirmed offset cannot pass what slave 2 acknowledged.
    patient = ("ha.max_lag_ms=60000", "ha.peer_timeout_ms=60000", "ha.slave_timeout_ms=60000")
    master, (s1, s2) = ha_group(broker_factory, tmp_path, slaves=2, master_extra=patient,
                                slave_extra=patient)
    wait_for(lambda: in_sync(master, 3), what="both slaves in sync")
    before = run(send_many(master.addr, "Vis", 100))[0]
    wait_for(lambda: confirmed(s1) == max_offset(master), what="s1 confirmed")
    os.kill(s2.proc.pid, signal.SIGSTOP)
    try:
        run(send_many(master.addr, "Vis", 200, first=100, oneway=True, expect=None))
        wait_for(lambda: metrics(master).get('tidemq_messages_put_total{topic="Vis"}') == 300,
                 what="the master stored every oneway send")
        end = max_offset(master)
        wait_for(lambda: max_offset(s1) == end, what="s1 holds the new bytes")
        time.sleep(0.5)
        m = metrics(s1)
        assert m["tidemq_store_confirmed_offset_bytes"] < end
        assert sorted(run(pull_all(s1.addr, "Vis"))) == sorted(before)   # nothing newer
        assert sorted(run(pull_all(master.addr, "Vis"))) == sorted(before)
    finally:
        os.kill(s2.proc.pid, signal.SIGCONT)
    wait_for(lambda: confirmed(s1) == end, what="confirmed after s2 resumed")
    assert len(run(pull_all(s1.addr, "Vis"))) == 300


def test_old_master_with_divergent_tail_is_cut_back(broker_factory, tmp_path):
    secret = ha_secret_file(tmp_path)
    port_a, port_b = free_port(), free_port()
    async_mode = "ha.replication_mode=ASYNC_MASTER"
    a = broker_factory(*ha_master_settings(secret, port_a, async_mode), name="a").start()
    b = broker_factory(*ha_slave_settings(secret, port_a, 1), name="b").start()
    wait_for(lambda: in_sync(a), what="in sync")
    common = run(send_many(a.addr, "Div", 300))[0]
    wait_for(lambda: max_offset(b) == max_offset(a), what="b caught up")
    common_end = max_offset(a)
    assert b.stop() == 0
    tail = run(send_many(a.addr, "Div", 100, first=300))[0]          # only A holds these
    assert max_offset(a) > common_end
    assert a.stop() == 0
    # B leads the next epoch; A comes back as its slave and must drop its tail.
    b2 = broker_factory(*ha_master_settings(secret, port_b, async_mode), name="b").start()
    newer = run(send_many(b2.addr, "Div", 50, first=1000))[0]
    new_end = max_offset(b2)
    a2 = broker_factory(*ha_slave_settings(secret, port_b, 1), name="a").start()
    wait_for(lambda: max_offset(a2) == new_end and confirmed(a2) >= new_end,
             what="a re-synced")
    seen = run(pull_all(a2.addr, "Div"))
    assert sorted(seen) == sorted(common + newer)
    assert not set(tail) & set(seen)
    assert a2.stop() == 0 and b2.stop() == 0
    assert log_bytes(a2.root_dir, new_end) == log_bytes(b2.root_dir, new_end)
    with open(os.path.join(a2.root_dir, "epochs")) as f:
        assert f.read().split("\n")[2:4] == ["1-0", f"2-{common_end}"]


def test_wrong_cluster_secret_is_refused(broker_factory, tmp_path):
    master, _ = ha_group(broker_factory, tmp_path, slaves=0)
    run(send_many(master.addr, "Sec", 20))
    other = tmp_path / "other"
    other.mkdir()
    bad_secret = ha_secret_file(other, b"a-different-secret-of-32-bytes!!")
    intruder = broker_factory(*ha_slave_settings(bad_secret, master.ha_port, 1), name="intruder")
    intruder.start()
    wait_for(lambda: "authentication failed" in master.log_text(), what="refusal logged")
    time.sleep(0.5)
    assert max_offset(intruder) == 0
    m = metrics(master)
    assert m["tidemq_ha_in_sync_replicas"] == 1
    assert not any(k.startswith("tidemq_ha_slave_connected") for k in m)
    for b in (master, intruder):          # the secret itself never reaches a log
        assert b"tidemq-test-ha-secret" not in b.log_text().encode()
        assert b"a-different-secret" not in b.log_text().encode()


def test_slave_is_read_only_and_state_follows_the_log(broker_factory, tmp_path):
    # The slave never writes its offsets file here: after SIGKILL only the log can restore them.
    master, (slave,) = ha_group(broker_factory, tmp_path,
                                slave_extra=("offsets_flush_interval_ms=600000",))
    wait_for(lambda: in_sync(master), what="in sync")
    run(send_many(master.addr, "St", 40))

    async def go():
        mc, sc = await RawClient.connect(master.addr), await RawClient.connect(slave.addr)
        try:
            r = await sc.request(RC.SEND_MESSAGE, send_ext("St", 0), b"no")
            assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "slave" in r.remark
            ext = {"consumerGroup": "G", "topic": "St", "queueId": 1, "commitOffset": 3}
            r = await sc.request(RC.UPDATE_CONSUMER_OFFSET, ext)
            assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "master" in r.remark
            r = await mc.request(RC.UPDATE_CONSUMER_OFFSET, {**ext, "commitOffset": 7})
            assert r.code == 0
            q = {"consumerGroup": "G", "topic": "St", "queueId": 1}
            deadline = time.monotonic() + 5
            while True:   # with the log stream: well under the 60 s sync of RocketMQ
                r = await sc.request(RC.QUERY_CONSUMER_OFFSET, q)
                if r.code == 0 and r.ext["offset"] == "7":
                    break
                assert time.monotonic() < deadline, "offset never reached the slave"
                await asyncio.sleep(0.05)
            made = {"topic": "Made", "readQueueNums": 3, "writeQueueNums": 3, "perm": 6,
                    "topicFilterType": "SINGLE_TAG"}
            r = await sc.request(RC.UPDATE_AND_CREATE_TOPIC, made)
            assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "master" in r.remark
            r = await mc.request(RC.UPDATE_AND_CREATE_TOPIC, made)
            assert r.code == 0
            deadline = time.monotonic() + 5
            while True:
                r = await sc.request(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "Made"})
                if r.code == 0:
                    break
                assert time.monotonic() < deadline, "topic never reached the slave"
                await asyncio.sleep(0.05)
            assert b'"1"' in r.body or b"1:" in r.body   # the slave names itself id 1
        finally:
            await mc.close()
            await sc.close()
    run(go())
    # Rebuilt from the log after a crash: SIGKILL (no offsets file written) and restart.
    slave.kill()
    slave.start()

    async def query():
        sc = await RawClient.connect(slave.addr)
        try:
            r = await sc.request(RC.QUERY_CONSUMER_OFFSET,
                                 {"consumerGroup": "G", "topic": "St", "queueId": 1})
            return r.code == 0 and r.ext["offset"] == "7"
        finally:
            await sc.close()
    # Visible once the restarted slave's confirmed offset passes the state record again.
    wait_for(lambda: run(query()), timeout=10, what="offset rebuilt after the restart")


def test_too_few_in_sync_replicas_refuses_before_writing(broker_factory, tmp_path):
    master, _ = ha_group(broker_factory, tmp_path, slaves=0,
                         master_extra=("ha.min_in_sync_replicas=2",))
    before = max_offset(master)
    codes = run(send_many(master.addr, "Few", 5, expect=(ResponseCode.SERVICE_NOT_AVAILABLE,)))
    assert len(codes[ResponseCode.SERVICE_NOT_AVAILABLE]) == 5
    assert max_offset(master) == before                     # nothing written


def test_sync_master_answers_flush_slave_timeout_when_the_slave_stalls(broker_factory, tmp_path):
    patient = ("ha.max_lag_ms=60000", "ha.peer_timeout_ms=60000")
    master, (slave,) = ha_group(broker_factory, tmp_path,
                                master_extra=patient + ("ha.slave_timeout_ms=400",),
                                slave_extra=patient)
    wait_for(lambda: in_sync(master), what="in sync")
    assert run(send_many(master.addr, "Slow", 10))[0]
    os.kill(slave.proc.pid, signal.SIGSTOP)          # in the in-sync set, but silent
    try:
        t0 = time.monotonic()
        codes = run(send_many(master.addr, "Slow", 3, first=10,
                              expect=(ResponseCode.FLUSH_SLAVE_TIMEOUT,)))
        assert time.monotonic() - t0 < 10
        stalled = codes[ResponseCode.FLUSH_SLAVE_TIMEOUT]
    finally:
        os.kill(slave.proc.pid, signal.SIGCONT)
    # Stored on the master all the same, and visible once the slave has it.
    wait_for(lambda: len(run(pull_all(master.addr, "Slow"))) == 13, what="stored on the master")
    wait_for(lambda: set(stalled) <= set(run(pull_all(slave.addr, "Slow"))),
             what="visible on the slave")


def test_master_far_ahead_of_a_pull_suggests_the_in_sync_slave(broker_factory, tmp_path):
    master, (slave,) = ha_group(broker_factory, tmp_path,
                                master_extra=("ha.suggest_slave_lag_bytes=20000",))
    wait_for(lambda: in_sync(master), what="in sync")
    run(send_many(master.addr, "Far", 200))           # 50 per queue, ~64 KB of log

    async def suggestions(addr, offset):
        c = await RawClient.connect(addr)
        try:
            r = await c.request(RC.PULL_MESSAGE, pull_ext("Far", 0, offset, max_nums=4,
                                                          sys_flag=0))
            assert r.code == 0
            return r.ext["suggestWhichBrokerId"]
        finally:
            await c.close()
    assert run(suggestions(master.addr, 0)) == "1"     # reading far behind the log end
    assert run(suggestions(master.addr, 46)) == "0"    # near the end: stay on the master
    wait_for(lambda: confirmed(slave) == max_offset(master), what="slave confirmed")
    assert run(suggestions(slave.addr, 0)) == "0"      # a slave never points elsewhere


def test_sync_flush_sync_master_group_acknowledges_after_both_fsyncs(broker_factory, tmp_path):
    flush = ("store.flush_mode=SYNC_FLUSH",)
    master, (slave,) = ha_group(broker_factory, tmp_path, master_extra=flush, slave_extra=flush)
    wait_for(lambda: in_sync(master), what="in sync")
    sent = run(send_many(master.addr, "Dur", 300))[0]
    end = max_offset(master)
    m = metrics(master)
    assert m['tidemq_ha_slave_acked_offset_bytes{slave="1"}'] >= end
    assert m["tidemq_store_flushed_offset_bytes"] >= end
    # The slave acknowledged only what it had fsynced: SIGKILL keeps exactly that.
    slave.kill()
    slave.start()
    wait_for(lambda: confirmed(slave) >= end, what="slave confirmed after restart")
    assert sorted(run(pull_all(slave.addr, "Dur"))) == sorted(sent)
