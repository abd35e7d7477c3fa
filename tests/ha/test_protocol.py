"""HA frame codec: round trips, frames split at every byte, garbage, limits, proofs."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.ha import protocol as p

NONCE = bytes(range(32))
SECRET = b"k" * 32


def sample_frames():
    hs = p.Handshake(3, "slave-1", "c1", NONCE, 0, 12345, ((1, 0), (3, 100)))
    hs = p.Handshake(hs.epoch, hs.node_id, hs.cluster, hs.client_nonce, hs.min_offset,
                     hs.max_offset, hs.history, p.slave_proof(SECRET, NONCE, hs))
    return [
        p.Hello(3, NONCE, "master-0", "c1"),
        hs,
        p.Reply(3, True, "", 0, 999, 100, 100, ((1, 0), (3, 100)), False, b"\x01" * 32),
        p.Reply(3, False, "authentication failed", 0, 0, 0, 0, (), True, b"\x02" * 32),
        p.Transfer(3, 3, 100, 150, 120, b"raw log bytes \x00\xff" * 5),
        p.Transfer(3, 1, 0, 0, 0, b""),
        p.Ack(3, 170),
        p.Heartbeat(3, 999, 120),
    ]


def test_round_trip_every_frame_type():
    frames = sample_frames()
    data = b"".join(p.encode(f) for f in frames)
    assert p.FrameDecoder().frames(data) == frames


def test_frames_split_at_every_byte_position_decode_identically():
    frames = sample_frames()
    data = b"".join(p.encode(f) for f in frames)
    for cut in range(len(data) + 1):
        d = p.FrameDecoder()
        got = d.frames(data[:cut]) + d.frames(data[cut:])
        assert got == frames, cut
    d = p.FrameDecoder()
    got = []
    for i in range(len(data)):
        got += d.frames(data[i:i + 1])
    assert got == frames


def test_encode_head_plus_data_equals_encode():
    t = sample_frames()[4]
    assert p.encode_head(t) + t.data == p.encode(t)


@given(st.binary(max_size=300))
@settings(max_examples=400)
def test_garbage_raises_only_the_protocol_error(data):
    d = p.FrameDecoder(max_frame_bytes=4096)
    try:
        d.frames(data)
    except p.HAProtocolError:
        with pytest.raises(p.HAProtocolError):   # and stays failed
            d.frames(b"")


@given(st.data())
@settings(max_examples=400)
def test_corrupted_valid_frames_raise_only_the_protocol_error(data):
    raw = bytearray(b"".join(p.encode(f) for f in sample_frames()))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        p.FrameDecoder().frames(bytes(raw))
    except p.HAProtocolError:
        pass


def test_oversized_frame_refused_from_its_header():
    big = p.encode(p.Transfer(1, 1, 0, 0, 0, b"x" * 5000))
    d = p.FrameDecoder(max_frame_bytes=4096)
    with pytest.raises(p.HAProtocolError, match="exceeds"):
        d.frames(big[:p.HEADER_BYTES])          # refused before the body arrives


@pytest.mark.parametrize("bad, match", [
    (b"XX" + b"\0" * 10, "magic"),
    (b"TH\x02" + b"\0" * 9, "version"),
    (b"TH\x01\x09" + b"\0" * 8, "unknown frame type"),
])
def test_bad_headers(bad, match):
    with pytest.raises(p.HAProtocolError, match=match):
        p.FrameDecoder().frames(bad)


def test_trailing_bytes_inside_a_frame_body_refused():
    raw = bytearray(p.encode(p.Ack(1, 5)))
    raw[11] += 1                      # body_len 9 for an 8-byte body
    with pytest.raises(p.HAProtocolError):
        p.FrameDecoder().frames(bytes(raw) + b"\0")


def test_transfer_header_checked():
    raw = p.encode(p.Transfer(1, 1, 0, 10, 0, b"ab"))
    bad = raw[:12] + (0).to_bytes(4, "big", signed=True) + raw[16:]   # data_epoch 0
    with pytest.raises(p.HAProtocolError, match="TRANSFER"):
        p.FrameDecoder().frames(bad)


def test_proofs_bind_nonce_epoch_and_body():
    hs = sample_frames()[1]
    assert p.proof_ok(p.slave_proof(SECRET, NONCE, hs), hs.proof)
    assert not p.proof_ok(p.slave_proof(b"other-secret-xxxxxx", NONCE, hs), hs.proof)
    assert not p.proof_ok(p.slave_proof(SECRET, bytes(32), hs), hs.proof)
    changed = p.Handshake(hs.epoch, hs.node_id, hs.cluster, hs.client_nonce, hs.min_offset,
                          hs.max_offset + 1, hs.history, hs.proof)
    assert not p.proof_ok(p.slave_proof(SECRET, NONCE, changed), hs.proof)
    newer = p.Handshake(hs.epoch + 1, hs.node_id, hs.cluster, hs.client_nonce, hs.min_offset,
                        hs.max_offset, hs.history, hs.proof)
    assert not p.proof_ok(p.slave_proof(SECRET, NONCE, newer), hs.proof)


def test_clip_keeps_whole_characters():
    s = "é" * 200
    assert len(p.clip(s).encode()) <= p.STRING_MAX_BYTES
    p.encode(p.Reply(1, False, p.clip(s), 0, 0, 0, 0, (), False, bytes(32)))
