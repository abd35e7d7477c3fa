"""Run the real `tidemq` command (this checkout's code) as a subprocess and read its result."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.broker_proc import REPO_ROOT
from tests.support.zookeeper import debian_zookeeper_available


def need_local_zookeeper() -> None:
    """`tidemq cluster up` runs Debian's ZooKeeper: fail under CI without it, else skip."""
    if not debian_zookeeper_available():
        if os.environ.get("CI"):
            pytest.fail("Debian's zookeeper package and java are needed (scripts/setup.sh)")
        pytest.skip("Debian's zookeeper package and java are not installed")


def tidemq(*args, ok=True, stdin=None, timeout_s=90.0, env=None):
    """(exit code, parsed JSON stdout or None, stderr). With ok=True the exit must be 0."""
    full_env = dict(os.environ, PYTHONPATH=REPO_ROOT, **(env or {}))
    full_env.pop("TIDEMQ_BROKER", None)
    proc = subprocess.run([sys.executable, "-m", "tidemq.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout_s, cwd=REPO_ROOT, env=full_env, input=stdin)
    if ok:
        assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr}"
    out = None
    if proc.stdout.strip():
        try:
            out = json.loads(proc.stdout.strip().splitlines()[-1])
        except ValueError:
            out = proc.stdout
    return proc.returncode, out, proc.stderr


def cli_wrapper(directory) -> str:
    """An executable `tidemq` in `directory` that runs this checkout's CLI (scripts such as
    make-secrets.sh call `$TIDEMQ certs`; an installed `tidemq` may be another copy)."""
    path = os.path.join(str(directory), "tidemq-cli")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nPYTHONPATH={REPO_ROOT} exec {sys.executable} -m tidemq.cli \"$@\"\n")
    os.chmod(path, 0o755)
    return path
