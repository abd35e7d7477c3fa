"""Bad input writes nothing; one process per store; format marker; config validation."""
import os
import subprocess
import sys

import pytest

from tidemq.node.store.config import StoreConfig, StoreConfigError
from tidemq.node.store.errors import MessageIllegal, StoreCorrupt, StoreLocked
from tidemq.node.store.message import StoreMessage
from tidemq.node.store.message_store import MessageStore

from .helpers import message, small_config


@pytest.mark.parametrize("bad", [
    StoreMessage("T", 0, b"x" * (16 * 1024 + 1)),                     # body over the limit
    StoreMessage("T" * 128, 0, b"x"),                                 # topic too long
    StoreMessage("bad topic!", 0, b"x"),                              # illegal characters
    StoreMessage("", 0, b"x"),                                        # empty topic
    StoreMessage("T", 0, b"x", {"P": "v" * 32760}),                   # properties too long
    StoreMessage("T", 5000, b"x"),                                    # queue id out of range
    StoreMessage("T", -1, b"x"),
])
def test_bad_message_is_refused_and_nothing_is_written(tmp_path, bad):
    store = MessageStore(small_config(tmp_path)).open()
    store.put([message(1)])
    end = store.max_offset
    with pytest.raises(MessageIllegal) as err:
        store.put([message(2), bad])  # a good message in the same batch is not written either
    assert str(err.value)
    assert store.max_offset == end and store.max_queue_offset("T", 2) == 0
    store.close()


def test_second_process_is_refused(tmp_path):
    store = MessageStore(small_config(tmp_path)).open()
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from tidemq.node.store.message_store import MessageStore\n"
            "from tidemq.node.store.errors import StoreLocked\n"
            "from tests.store.helpers import small_config\n"
            "try:\n    MessageStore(small_config(%r)).open()\nexcept StoreLocked as e:\n"
            "    print('LOCKED', e); sys.exit(3)\n") % (os.getcwd(), str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "in use by another process" in proc.stdout
    store.close()
    with pytest.raises(StoreLocked):
        a = MessageStore(small_config(tmp_path)).open()
        try:
            MessageStore(small_config(tmp_path)).open()
        finally:
            a.close()


def test_format_marker_guards_the_store(tmp_path):
    MessageStore(small_config(tmp_path)).open().close()
    with pytest.raises(StoreCorrupt, match="whole_record_crc cannot change"):
        MessageStore(small_config(tmp_path, whole_record_crc=False)).open()
    (tmp_path / "store_version").write_bytes(b"tidemq-store 99 whole_record_crc=1\n")
    with pytest.raises(StoreCorrupt, match="unknown store format"):
        MessageStore(small_config(tmp_path)).open()


def test_file_of_another_size_is_refused(tmp_path):
    store = MessageStore(small_config(tmp_path)).open()
    store.put([message(1)])
    store.close()
    with pytest.raises(StoreCorrupt, match="expected 131072"):
        MessageStore(small_config(tmp_path, commitlog_file_bytes=128 * 1024)).open()


def test_config_reports_every_problem_at_once(tmp_path):
    with pytest.raises(StoreConfigError) as err:
        StoreConfig(root_dir=str(tmp_path), commitlog_file_bytes=1000, flush_mode="SOMETIMES",
                    disk_warning_ratio=0.1, delete_when="25")
    text = str(err.value)
    for word in ("commitlog_file_bytes", "flush_mode", "disk ratios", "delete_when"):
        assert word in text
    assert len(err.value.problems) >= 4
