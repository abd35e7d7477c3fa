"""How a connection's flush hands its queued replies to the transport
(node/remoting/connection.py rule 2): small pieces joined into one write, a large body written
on its own without a copy, and the bytes on the wire exactly the queued ones, in order."""
import asyncio
import random

from tests.broker.conftest import run
from tests.support.raw_client import RawClient, decode_records, properties, pull_ext, send_ext
from tidemq.node.remoting.connection import WRITE_UNJOINED_BYTES, write_pieces
from tidemq.protocol.codes import RequestCode as R

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


def test_large_and_small_replies_of_one_flush_arrive_whole_and_in_order(broker):
    """A real broker: pulls whose replies exceed WRITE_UNJOINED_BYTES pipelined with small
    requests on one connection; every reply decodes, each pull carries its queue's records
    in order, each small reply its own answer."""
    bodies = {q: [b"%d-%04d-" % (q, i) + b"x" * 1000 for i in range(120)] for q in range(2)}

    async def go():
        async with await RawClient.connect(broker.addr) as c:
            r = await c.request(R.UPDATE_AND_CREATE_TOPIC, {
                "topic": "WP", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6})
            assert r.code == 0, r.remark
            for q, items in bodies.items():
                for body in items:
                    r = await c.request(R.SEND_MESSAGE, send_ext("WP", q, properties()), body)
                    assert r.code == 0, r.remark
            for _ in range(3):
                futs = []
                for q in (0, 1):
                    futs.append(c.start(R.PULL_MESSAGE, pull_ext("WP", q, 0, max_nums=200)))
                    futs.append(c.start(R.GET_MAX_OFFSET, {"topic": "WP", "queueId": q}))
                replies = await asyncio.wait_for(asyncio.gather(*futs), 30)
                for q in (0, 1):
                    pulled, top = replies[2 * q], replies[2 * q + 1]
                    assert pulled.code == 0 and len(pulled.body) > BIG
                    assert [m.body for m in decode_records(bytes(pulled.body))] == bodies[q]
                    assert top.code == 0 and int(top.ext["offset"]) == 120
    run(go())
