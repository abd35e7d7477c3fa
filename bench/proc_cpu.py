"""CPU time of a process from /proc/<pid>/stat, for the benchmarks' CPU-per-message figures
(the broker runs as a separate process; its CPU time, unlike wall-clock rates, barely moves
with other load on a shared machine)."""
from __future__ import annotations

import os

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds process `pid` has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces and ')'
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK  # utime, stime


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds process `pid` has used so far."""
    return sum(cpu_times(pid))
