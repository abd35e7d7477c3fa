"""election.choose: in-sync members only, newest epoch then longest log, hand-off preference,
unclean election only when allowed (pure)."""
from tidemq.coordinator.election import choose, next_epoch
from tidemq.coordinator.layout import GroupState, Member


def m(node, last_epoch=3, max_offset=0, broker_id=0):
    return Member(node, broker_id, last_epoch=last_epoch, max_offset=max_offset)


STATE = GroupState(3, "a", frozenset({"a", "b", "c"}))


def test_longest_log_among_in_sync_members_wins():
    live = {"b": m("b", max_offset=100), "c": m("c", max_offset=250), "d": m("d", max_offset=999)}
    assert choose(STATE, live, False).winner == "c"      # d is not in the in-sync set


def test_newer_epoch_beats_a_longer_log():
    live = {"b": m("b", last_epoch=4, max_offset=10), "c": m("c", last_epoch=3, max_offset=900)}
    assert choose(STATE, live, False).winner == "b"


def test_ties_go_to_the_lowest_broker_id_then_node():
    live = {"c": m("c", broker_id=1), "b": m("b", broker_id=2)}
    assert choose(STATE, live, False).winner == "c"


def test_no_in_sync_member_alive_means_no_master_unless_unclean():
    live = {"d": m("d", max_offset=5)}
    c = choose(STATE, live, False)
    assert c.winner is None and "no live in-sync member" in c.reason
    c = choose(STATE, live, True)
    assert c.winner == "d" and c.unclean


def test_a_new_group_takes_any_member_and_handoff_is_preferred():
    assert choose(GroupState(), {"x": m("x", 0, 7), "y": m("y", 0, 9)}, False).winner == "y"
    live = {"b": m("b", max_offset=100), "c": m("c", max_offset=250)}
    assert choose(STATE, live, False, preferred="b").winner == "b"
    assert choose(STATE, live, False, preferred="zz").winner == "c"


def test_next_epoch_is_above_every_known_epoch():
    assert next_epoch(STATE, {"b": m("b", last_epoch=7)}) == 8
    assert next_epoch(STATE, {}) == 4
