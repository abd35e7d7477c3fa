"""get_messages fetches consume-queue units in steps sized by the bytes a pull has left; what
it returns must be exactly what one walk over the queue gives: the same records, the same
count and byte caps, the same next offset, with and without a tag filter."""
import random

import pytest

from tests.store.helpers import payload, small_config
from tidemq.node.store.message import StoreMessage
from tidemq.node.store.message_store import MessageStore
from tidemq.protocol.jhash import java_string_hash

N = 700


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = random.Random(5)
    s = MessageStore(small_config(tmp_path_factory.mktemp("fetch"), commitlog_file_bytes=4 << 20)).open()
    tags = ["rare" if i % 150 == 7 else f"t{i % 2}" for i in range(N)]
    sizes = [rng.choice([20, 300, 1000, 3000]) for _ in range(N)]
    for i in range(0, N, 50):
        s.put([StoreMessage("F", 0, payload(j, sizes[j]), {"TAGS": tags[j], "UNIQ_KEY": f"U{j}"})
               for j in range(i, i + 50)])
    records = [s.get_messages("F", 0, i, 1).messages[0] for i in range(N)]
    yield s, records, tags
    s.close()


def one_walk(records, tags, offset, max_count, max_bytes, tag):
    """The reference: get_messages' rules over the whole queue in one pass."""
    out, total, pos = [], 0, offset
    for i in range(offset, N):
        if len(out) >= max_count or total >= max_bytes or (out and total + len(records[i]) > max_bytes):
            break
        pos = i + 1
        if tag is None or tags[i] == tag:
            out.append(records[i])
            total += len(records[i])
    return out, pos


@pytest.mark.parametrize("offset", [0, 13, 640])
@pytest.mark.parametrize("max_count,max_bytes", [(1024, 256 * 1024), (32, 256 * 1024),
                                                 (1024, 5000), (3, 10**9)])
@pytest.mark.parametrize("tag", [None, "t1", "rare"])
def test_same_as_one_walk(store, offset, max_count, max_bytes, tag):
    s, records, tags = store
    codes = None if tag is None else {java_string_hash(tag)}
    r = s.get_messages("F", 0, offset, max_count, max_bytes, codes)
    want, next_offset = one_walk(records, tags, offset, max_count, max_bytes, tag)
    assert [bytes(m) for m in r.messages] == [bytes(m) for m in want]
    if want:
        assert r.next_begin_offset == next_offset
