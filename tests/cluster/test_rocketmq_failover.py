"""The unmodified `rocketmq` client keeps producing and consuming across a failover, after its
own route refresh; the test measures how long that takes (README). Its push consumer may miss
refreshes to a client bug (rocketmq_failover_script.py); then a restarted consumer of the same
group must receive every acknowledged message the first one did not."""
import json
import os
import subprocess
import sys
import time

import pytest

from tests.client.test_compat_rocketmq import _REASON
from tests.support.broker_proc import REPO_ROOT
from tests.support.cluster import ClusterHarness, create_topic

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rocketmq_failover_script.py")
DURATION_S = 95.0   # a cap, for sending and again for receiving: the cpp client polls routes
                    # every 30 s; the script ends once it has followed the failover

pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"rocketmq unavailable: {_REASON}")


def test_rocketmq_client_follows_a_failover(zk_hosts, tmp_path):
    import asyncio
    h = ClusterHarness(zk_hosts, tmp_path, {"g1": 3}).start()
    proc = None
    try:
        h.wait_masters()
        h.wait_in_sync("g1", 3)
        asyncio.run(create_topic(h, "CppFailover", 4))
        env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=REPO_ROOT)
        proc = subprocess.Popen([sys.executable, SCRIPT, h.namesrv_addr, "CppFailover",
                                 str(DURATION_S)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=str(tmp_path))
        assert proc.stdout.readline().strip() == "READY"
        time.sleep(3.0)
        old, broker = h.master("g1")
        broker.kill()
        killed = time.time()
        h.wait_master("g1", not_node=old)
        out, err = proc.communicate(timeout=2 * DURATION_S + 100)
        lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, err[-3000:]
        result = json.loads(lines[-1][len("RESULT "):])
        sends = result["sends"]
        assert any(s[2] == 0 for s in sends if s[0] < killed), "no send before the kill"
        after = [s for s in sends if s[0] > killed and s[2] == 0]
        assert after, f"no successful send after the failover: {sends[-5:]}"
        recovery_s = after[0][0] - killed
        got = {body: (t, n) for t, body, n in result["got"]}
        ok_bodies = {s[1] for s in sends if s[2] == 0}
        missing = ok_bodies - got.keys()
        assert not missing, f"{len(missing)} acknowledged messages not consumed: {sorted(missing)[:5]}"
        consumed_s = got[after[0][1]][0] - killed
        how = "by a restarted consumer" if result["restarted"] else "by the same consumer"
        print(f"rocketmq client: first SEND_OK {recovery_s:.1f} s after SIGKILL of the master; "
              f"received {consumed_s:.1f} s after it, {how}")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        h.stop()
