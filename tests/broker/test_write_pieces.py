"""How a connection's flush hands its queued replies to the transport
(node/remoting/connection.py rule 2): small pieces joined into one write, a large body written
on its own without a copy, and the bytes on the wire exactly the queued ones, in order."""
import random

from tidemq.node.remoting.connection import WRITE_UNJOINED_BYTES, write_pieces

BIG = WRITE_UNJOINED_BYTES


def test_small_pieces_are_one_write():
    out = [b"head1", b"body1", b"head2"]
    assert write_pieces(out) == [b"head1body1head2"]


def test_a_large_body_is_written_alone_and_uncopied():
    body = bytes(BIG)
    out = [b"head", body, b"h2", b"b2"]
    writes = write_pieces(out)
    assert writes == [b"head", body, b"h2b2"]
    assert writes[1] is body  # handed over as is, not copied into a join


def test_a_single_small_piece_of_a_run_is_not_copied():
    head, body = b"head", b"x" * BIG
    writes = write_pieces([head, body])
    assert writes[0] is head and writes[1] is body


def test_the_bytes_and_their_order_never_change():
    rng = random.Random(7)
    for _ in range(200):
        out = [rng.randbytes(rng.choice([0, 1, 17, BIG - 1, BIG, BIG + 5]))
               for _ in range(rng.randint(1, 8))]
        writes = write_pieces(out)
        assert b"".join(writes) == b"".join(out)
        # no two neighbouring writes are both small: small runs are always joined
        assert not any(len(a) < BIG and len(b) < BIG for a, b in zip(writes, writes[1:]))
