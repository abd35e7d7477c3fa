"""node/replication/service.py rule 6 on real stores in one process: a slave holding replicated bytes
it has not seen confirmed is promoted by become_master; delayed delivery and transactions
(ReplicaRole.state_ready) wait until that tail is dispatched and its state records applied,
and the state snapshot is written only then (never older than the records before it)."""
import asyncio

from tests.ha.test_replicated_state import make_node, state_of
from tests.support.broker_proc import ha_secret_file
from tidemq.node.config import load_config
from tidemq.node.replication.service import ReplicaRole, Replication
from tidemq.node.sending.schedule import SCHEDULE_GROUP, SCHEDULE_TOPIC


def test_a_promoted_slave_serves_delays_and_transactions_only_once_settled(tmp_path):
    async def main():
        loop = asyncio.get_running_loop()
        m, _, mstate = make_node(tmp_path / "m", loop, True)
        mstate.on_become_master()
        m.offsets.commit(SCHEDULE_GROUP, SCHEDULE_TOPIC, 2, 7)   # delayed-delivery progress
        mstate.flush()
        s, _, _ = make_node(tmp_path / "s", loop, False)
        # The slave receives every byte but no confirmation: nothing is dispatched yet.
        pos = 0
        while pos < m.store.max_offset:
            data = m.store.read_raw(pos, 64 * 1024)
            s.store.append_raw(pos, data)
            pos += len(data)
        assert s.store.dispatcher.dispatched_offset < s.store.max_offset
        cfg = load_config(None, ["ha.role=SLAVE", "broker_id=1", "ha.master_addr=127.0.0.1:9",
                                 f"ha.secret_file={ha_secret_file(tmp_path)}",
                                 "ha.listen_port=0"])
        repl = Replication(cfg, s.store)
        state = state_of(s, repl)
        state.attach()
        repl.state = state
        role = ReplicaRole(repl, 1)
        try:
            await repl.become_master(repl.service.last_epoch + 1)
            # Writable at once, but the tail (with the progress record) is not applied yet.
            assert role.writable and not role.state_ready
            assert s.offsets.query(SCHEDULE_GROUP, SCHEDULE_TOPIC, 2) is None
            assert state.records_written == 0                     # no snapshot yet
            for _ in range(200):                                  # HA confirms the tail
                if role.state_ready:
                    break
                await asyncio.sleep(0.02)
            assert role.state_ready
            assert s.offsets.query(SCHEDULE_GROUP, SCHEDULE_TOPIC, 2) == 7
            assert state.records_written >= 1                     # the snapshot, after
        finally:
            await repl.stop()
            m.store.close()
            s.store.close()
    asyncio.run(main())
