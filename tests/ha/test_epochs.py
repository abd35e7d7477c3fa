"""Epoch history rules, its file, and consistent_point against a brute-force model."""
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.ha.epochs import (
    EpochError,
    EpochFile,
    EpochHistory,
    consistent_point,
    decode_file,
    encode_file,
)
from tidemq.ha.master_session import decide_start


def test_append_rules_allow_equal_start_but_not_older_epoch_or_start():
    h = EpochHistory([(1, 0), (2, 100)])
    h.append(3, 100)              # elected with no new writes: same start is allowed
    assert h.entries == ((1, 0), (2, 100), (3, 100))
    for bad in [(3, 200), (2, 200), (4, 99), (0, 500)]:
        with pytest.raises(EpochError):
            h.append(*bad)
    assert h.entry_for(100) == (3, 100, None)    # the newest entry at an equal start
    assert h.entry_for(99) == (1, 0, 100)
    assert h.end_of(1, 555) == 100 and h.end_of(2, 555) == 555


def test_truncate_from_and_prefix():
    h = EpochHistory([(1, 0), (2, 100), (3, 100), (5, 300)])
    h.truncate_from(100)
    assert h.entries == ((1, 0),)
    h = EpochHistory([(1, 0), (2, 100), (5, 300)])
    h.truncate_prefix(150)
    assert h.entries == ((2, 100), (5, 300))


def test_file_round_trip_layout_and_bak_fallback(tmp_path):
    f = EpochFile(str(tmp_path))
    assert len(f.load()) == 0                       # no file: empty history
    h = EpochHistory([(1, 0), (4, 1234567)])
    f.save(h)
    text = (tmp_path / "epochs").read_text()
    lines = text.split("\n")
    assert lines[0] == "2" and lines[2:4] == ["1-0", "4-1234567"] and text.endswith("\n")
    assert f.load() == h
    (tmp_path / "epochs").write_text(text.replace("4-1234567", "4-1234568"))  # CRC breaks
    assert f.load() == h                            # from epochs.bak
    (tmp_path / "epochs.bak").write_text("garbage")
    with pytest.raises(EpochError):
        f.load()
    os.remove(tmp_path / "epochs")
    os.remove(tmp_path / "epochs.bak")
    assert len(f.load()) == 0


def test_zero_crc_means_unchecked():
    assert decode_file(b"1\n0\n7-42\n").entries == ((7, 42),)
    with pytest.raises(EpochError):
        decode_file(b"2\n0\n7-42\n")                # count mismatch
    assert decode_file(encode_file(EpochHistory())) == EpochHistory()


# -- brute-force model ------------------------------------------------------------------------
@st.composite
def forked_logs(draw):
    """Two nodes' logs grown from one lineage: a common run of epochs (each side holds a
    prefix of it, ending part-way into its last common epoch), then epochs of its own (never
    shared: one master per epoch), some of them empty (a master elected with no writes).
    Every byte is labelled (epoch, position); equal labels mean equal bytes."""
    epoch, pos, common = 0, 0, []
    for _ in range(draw(st.integers(0, 4))):
        epoch += draw(st.integers(1, 3))
        length = draw(st.integers(1, 12))
        common.append((epoch, pos, length))
        pos += length
    own = sorted(draw(st.sets(st.integers(epoch + 1, epoch + 12), max_size=6)))
    mine = [e for e in own if draw(st.booleans())]
    sides = []
    for own_epochs in (mine, [e for e in own if e not in mine]):
        k = draw(st.integers(0, len(common)))
        entries, labels = [], []
        for i, (e, start, length) in enumerate(common[:k]):
            held = length if i < k - 1 else draw(st.integers(1, length))
            entries.append((e, start))
            labels += [(e, start + j) for j in range(held)]
        for e in own_epochs:
            start = len(labels)
            entries.append((e, start))
            labels += [(e, start + j) for j in range(draw(st.integers(0, 8)))]
        sides.append((EpochHistory(entries), labels))
    return sides


def common_prefix(a, b) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


@given(forked_logs())
@settings(max_examples=600)
def test_consistent_point_matches_the_model(sides):
    (ha_, la), (hb, lb) = sides
    truth = common_prefix(la, lb)
    point = consistent_point(ha_, len(la), hb, len(lb))
    assert point == consistent_point(hb, len(lb), ha_, len(la))      # symmetric
    if point is None:
        assert truth == 0, (ha_, hb)
        # decide_start falls back to the earlier first start: 0 here, the true prefix.
        if len(ha_) and len(hb) and la:
            assert decide_start(hb, 0, len(lb), ha_, 0, len(la)) == (0, False, None)
    else:
        assert point == truth, (ha_, len(la), hb, len(lb))


@given(forked_logs())
@settings(max_examples=300)
def test_decided_start_never_keeps_a_divergent_byte(sides):
    """What the master tells a slave to keep is always a true common prefix."""
    (hm, lm), (hs, ls) = sides
    if not len(hm):
        return
    start, reset, why = decide_start(hm, 0, len(lm), hs, 0, len(ls))
    if why is None:
        assert not reset and start <= common_prefix(lm, ls)
    else:
        assert ls and not len(hs)


def test_decide_start_cases():
    m = EpochHistory([(1, 0), (3, 1200)])
    assert decide_start(m, 0, 2000, EpochHistory(), 0, 0) == (0, False, None)       # empty
    assert decide_start(m, 4096, 2000, EpochHistory(), 0, 0) == (4096, True, None)  # whole log
    s = EpochHistory([(1, 0), (2, 1000)])
    assert decide_start(m, 0, 2000, s, 0, 1500) == (1000, False, None)   # divergent tail
    assert decide_start(m, 1100, 2000, s, 0, 1500) == (1100, True, None)  # point deleted
    _, _, why = decide_start(m, 0, 2000, EpochHistory(), 0, 10)
    assert "no epoch history" in why
    _, _, why = decide_start(m, 0, 2000, EpochHistory([(2, 5)]), 0, 10)   # pre-epoch bytes
    assert "no common epoch" in why
