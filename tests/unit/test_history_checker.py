"""The history checker finds each anomaly it names, and passes a clean history."""
from tests.support.history import History

Q1, Q2 = ("g1", 0), ("g2", 1)


def clean() -> History:
    h = History()
    h.send("a", "ok", Q1, 0)
    h.send("b", "ok", Q1, 1)
    h.send("c", "maybe")                       # never stored: allowed
    h.send("d", "maybe", attempts=2)
    h.send("e", "failed")
    for p, q, o in [("a", Q1, 0), ("b", Q1, 1), ("a", Q1, 0), ("d", Q2, 0), ("d", Q2, 1)]:
        h.consume(p, q, o)                     # "a" redelivered, "d" stored once per attempt
    return h


def test_clean_history_passes():
    report = clean().assert_valid()
    assert all(not v for v in report.values())


def test_each_anomaly_is_reported():
    h = clean()
    h.send("lost", "ok", Q2, 5)
    h.send("dup", "ok", Q2, 6)
    h.consume("dup", Q2, 6)
    h.consume("dup", Q2, 7)
    h.send("refused", "failed")
    h.consume("refused", Q1, 9)
    h.consume("ghost", Q1, 10)
    h.consume("b", Q1, 0)                      # offset 0 of Q1 now holds a and b
    h.send("late", "ok", Q1, 1)                # acked after b at a lower-or-equal offset
    h.consume("late", Q1, 1)
    r = h.check()
    assert r["lost"] == ["lost"]
    assert [p for p, _ in r["duplicates"]] == ["b", "dup"]   # b: also at offset 0
    assert r["failed_stored"] == ["refused"]
    assert r["unknown"] == ["ghost"]
    assert sorted(r["inconsistent"]) == [((Q1, 0), ["a", "b"]), ((Q1, 1), ["b", "late"])]
    assert r["reordered"] and r["reordered"][0][0] == ("p", Q1)
    try:
        h.assert_valid()
    except AssertionError as exc:
        assert "lost" in str(exc)
    else:
        raise AssertionError("assert_valid passed a bad history")
