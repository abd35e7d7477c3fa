"""TIDEMQ_PURE_PYTHON=1, read once at import, makes every accelerated function its pure twin."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = """
from tidemq import message as client_message
from tidemq.producer import send_codec
from tidemq.protocol import accel, record, remoting
from tidemq.node.processors import send, store_host
from tidemq.node.sending import dedup_keys
from tidemq.node.store import commit_log, index_file, message
assert accel.PURE_FORCED and not accel.COMPILED
assert not dedup_keys.COMPILED and type(dedup_keys.key_table(10)) is dedup_keys.KeyWindow
for fn in (record.encode_into, record.decode_properties, record.prop_fields, send.decode_batch,
           send_codec.encode_batch_body, remoting.decode_binary_ext, index_file.index_entries,
           commit_log.append_records, message.wire_messages, client_message.record_views,
           send.offset_msg_ids, remoting.decode_frames, store_host.join_records):
    assert fn is accel.PURE[fn.__name__], fn
print(len(accel.PURE))
"""


@pytest.mark.parametrize("value", ["1", "yes"])
def test_env_forces_pure(value):
    env = dict(os.environ, TIDEMQ_PURE_PYTHON=value)
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 6


def test_env_zero_keeps_compiled():
    env = dict(os.environ, TIDEMQ_PURE_PYTHON="0")
    code = "from client.protocol import accel; print(accel.COMPILED)"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
