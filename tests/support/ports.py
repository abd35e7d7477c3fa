"""Ports for test servers that must be chosen before the server starts (ZooKeeper quorum ports,
a broker restarted on the same address).

Ports come from below the kernel's ephemeral range (32768-60999 by default): a port the OS hands
out for bind(0) can be taken again by any outgoing connection before our server binds it, which
once kept a 3-node ZooKeeper ensemble from forming in CI. Each port is handed out once per process.
"""
from __future__ import annotations

import random
import socket

_LOW, _HIGH = 20000, 32000
_given: set[int] = set()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    for _ in range(1000):
        port = random.randrange(_LOW, _HIGH)
        if port not in _given and _bindable(port):
            _given.add(port)
            return port
    raise RuntimeError(f"no free port in {_LOW}-{_HIGH}")
