"""Seeded simulation of a master and two slaves over a lossy link with elections and
crashes (tests/ha/sim.py): invariants after every step, convergence once faults stop."""
import pytest

from .sim import Simulation

SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
def test_simulation_keeps_prefix_and_confirmed(seed):
    sim = Simulation(seed, steps=2500, min_isr=1 + seed % 2).run()
    sim.settle()
    st = sim.stats
    # The run must have exercised what it claims to test.
    assert st["writes"] > 200 and st["drops"] > 5, sim.describe()
    assert sim.committed and len(sim.committed) == sim.nodes[sim.coord.master].store.max_offset


def test_simulation_exercises_elections_fencing_and_truncation():
    """Across the seeds, every fault kind happened at least once (a sim that never elects
    or never truncates would pass its invariants vacuously)."""
    totals = {}
    for seed in SEEDS:
        sim = Simulation(seed, steps=2500, min_isr=1 + seed % 2).run()
        for k, v in sim.stats.items():
            totals[k] = totals.get(k, 0) + v
    for key in ("elections", "crashes", "truncations", "fenced", "misroutes"):
        assert totals[key] > 0, totals


def test_simulation_is_deterministic():
    a = Simulation(7, steps=800).run()
    b = Simulation(7, steps=800).run()
    assert a.stats == b.stats and a.committed == b.committed
