"""node/sending/delay_plan.py: level parsing and the timer hops (never early, few hops, bounded
lateness behind a queue head)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.node.sending import delay_plan as dp


def test_levels_parse_java_units_and_ms():
    assert dp.parse_levels(dp.DEFAULT_DELAY_LEVELS)[:5] == [1000, 5000, 10_000, 30_000, 60_000]
    assert dp.parse_levels(dp.DEFAULT_DELAY_LEVELS)[-1] == 7_200_000
    assert len(dp.parse_levels(dp.DEFAULT_DELAY_LEVELS)) == 18
    assert dp.parse_levels("100ms 2s 1d") == [100, 2000, 86_400_000]


@pytest.mark.parametrize("text", ["", "1x", "s", "-1s", "0s", "1.5s", "1s 2", " ".join(["1s"] * 65)])
def test_bad_levels_are_refused(text):
    with pytest.raises(dp.DelayPlanError):
        dp.parse_levels(text)


def test_levels_past_the_last_use_the_last():
    levels = [100, 200, 300]
    assert dp.level_queue(1, levels) == (0, 100)
    assert dp.level_queue(3, levels) == (2, 300)
    assert dp.level_queue(40, levels) == (2, 300)


@settings(max_examples=300)
@given(st.integers(min_value=1, max_value=3 * 86_400_000), st.integers(min_value=0, max_value=10**13))
def test_timer_hops_never_early_and_few(remaining, now):
    due = now + remaining
    hops = 0
    while now < due:  # the scheduler delivers once due <= now
        qid, hop = dp.timer_hop(due - now, now, due)
        assert dp.is_timer_queue(qid)
        assert now < hop <= due  # leaves its queue no earlier than now and never after due
        if qid == dp.TIMER_QUEUE_BASE:
            assert hop == due and due - now < 2 * dp.STEP_MS
            break
        k = qid - dp.TIMER_QUEUE_BASE
        assert hop - now == dp.STEP_MS << k <= due - now < dp.STEP_MS << (k + 1)
        now = hop  # the scheduler re-puts it at its hop time at the earliest
        hops += 1
    assert hops <= 23


def test_a_queue_head_holds_its_followers_back_by_less_than_its_width():
    # Queue 0 entries are stored in order; each waits for its own due time, at most 2 steps
    # after being stored, so one stored later is held back by less than 2 steps.
    stored_head, stored_next = 1000, 1001
    _, head_due = dp.timer_hop(99, stored_head, stored_head + 99)
    _, next_due = dp.timer_hop(1, stored_next, stored_next + 1)
    assert head_due - next_due < 2 * dp.STEP_MS
