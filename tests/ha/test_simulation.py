"""Seeded simulation of a master and two slaves over a lossy link with elections and
crashes (tests/ha/sim.py): invariants after every step, convergence once faults stop.
A failing seed replays exactly: Simulation(seed, ...).run() under a debugger."""
import pytest

from .sim import Simulation

# (seed, min_in_sync_replicas, elections per step): a calm mix and an election storm.
RUNS = [(seed, 1 + seed % 2, 0.004) for seed in range(10)] + \
       [(100 + seed, 1 + seed % 2, 0.03) for seed in range(6)]


@pytest.mark.parametrize("seed, min_isr, election_rate", RUNS)
def test_simulation_keeps_prefix_and_confirmed(seed, min_isr, election_rate):
    sim = Simulation(seed, steps=2500, min_isr=min_isr, election_rate=election_rate).run()
    stats = dict(sim.stats)
    sim.settle()
    # The run must have exercised what it claims to test.
    assert stats["writes"] > 200 and stats["drops"] > 5, sim.describe()
    master = sim.nodes[sim.coord.master].store
    assert len(sim.committed) == master.max_offset and sim.committed == bytes(master.log)


def test_simulation_exercises_elections_fencing_and_truncation():
    """Across the runs every fault kind happened (a simulation that never elects or never
    truncates would pass its invariants vacuously)."""
    totals = {}
    for seed, min_isr, rate in RUNS:
        sim = Simulation(seed, steps=2500, min_isr=min_isr, election_rate=rate).run()
        for k, v in sim.stats.items():
            totals[k] = totals.get(k, 0) + v
    for key in ("elections", "crashes", "truncations", "fenced", "misroutes"):
        assert totals[key] > 0, totals


def test_simulation_is_deterministic():
    a = Simulation(7, steps=800).run()
    b = Simulation(7, steps=800).run()
    assert a.stats == b.stats and a.committed == b.committed
