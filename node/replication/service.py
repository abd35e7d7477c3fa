"""Broker glue for HA replication: owns one HAService (ha/service.py) for the broker and answers
the questions the request path asks of it.

    repl = Replication(cfg, store)          # cfg.ha.role MASTER or SLAVE
    await repl.start()                      # static role from config (below)
    await repl.become_master(epoch) -> "host:port"     # explicit role switches: the
    await repl.follow((host, port), epoch)             # coordinator (cluster mode) calls these
    repl.set_coordinator(isr_factory, on_fenced)        # before its first become_master
    repl.write_refusal() -> str | None      # BEFORE a put: why this node takes no writes now
    repl.when_replicated(end, callback)     # SYNC_MASTER: callback(True) once every in-sync
                                            # replica holds `end`, False past slave_timeout_ms

It also fits coordinator/replica.py's Replica shape (fence, step_down, progress).

Rules:
1. A replicated broker's store runs confirm_mode "external": what consumers may see (on the
   master and on slaves) is the confirmed offset HA computes, never more.
2. The store refuses local puts (store.put_refusal) unless this node is an unfenced master, so
   no code path (delays, transactions, state records) can write into a slave's log.
3. Every put on the master tells HA at once (store.after_put -> notify_appended): streaming
   and the confirmed offset follow the write, not a timer.
4. Roles from static config: a MASTER leads history.last_epoch + 1 (a restart is a new epoch,
   so a slave that holds bytes this node lost in a crash is cut back to agree), a SLAVE follows
   with its own last epoch (it learns newer ones from the master's frames).
6. A new master's tail (bytes it held but had not seen confirmed) is dispatched only once it
   confirms them, so the consumer offsets (delayed-delivery and transaction progress among
   them) that the tail's state records carry arrive after the promotion. Delayed delivery and
   transaction checks start (ReplicaRole.state_ready) only once the log held at promotion is
   dispatched and applied; before that they would start from older progress (repeats).
7. The secret is read from ha.secret_file or the ha.secret_env variable and never logged;
   HAConfig's repr leaves it out.
8. The duplicate window (node/sending/dedup.py rule 6) is kept current off the loop while this node is
   a slave (a pass every SHADOW_REFRESH_S in a worker thread) and caught up once more at the
   start of become_master; the send path then adopts it at its first write and walks only the
   index entries written since (a few), instead of every remembered record on the loop. A
   pass still running is aborted, never waited for, and a shadow not built yet (a full pass
   after a restart or a cut) is left to the first write, as before.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os

from tidemq.ha.config import SYNC_MASTER, HAConfig, HAConfigError
from tidemq.ha.service import FENCED, MASTER, SLAVE, HAService
from tidemq.node.replication.static_group import slave_broker_ids
from tidemq.node.security.settings import ha_tls
from tidemq.node.sending.dedup import ShadowWindow

log = logging.getLogger("tidemq.replication")
ROLES = ("standalone", "MASTER", "SLAVE", "cluster")  # cluster: ZooKeeper drives (node/replication/cluster_mode.py)
# Java's accessMessageInMemoryMaxRatio (40% of RAM): reading further behind than this goes to
# disk, so the pull is pointed at a slave.
SHADOW_REFRESH_S = 1.0   # a slave's duplicate-window pass (rule 8)
HOT_BYTES = int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 0.40)


class SecretError(ValueError):
    pass


def read_secret(section) -> bytes:
    """The shared HA secret; SecretError names where it was looked for, never its value."""
    if section.secret_file:
        try:
            with open(os.path.expanduser(section.secret_file), "rb") as f:
                secret = f.read().rstrip(b"\r\n")
        except OSError as exc:
            raise SecretError(f"cannot read ha.secret_file {section.secret_file!r}: "
                              f"{exc.strerror}") from None
        where = f"ha.secret_file {section.secret_file!r}"
    else:
        secret = os.environ.get(section.secret_env, "").encode()
        where = f"environment variable {section.secret_env!r} (ha.secret_env)"
        if not secret:
            raise SecretError(f"no HA secret: set ha.secret_file or {where}")
    if len(secret) < 16:
        raise SecretError(f"the HA secret in {where} must be at least 16 bytes")
    return secret


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port, got {text!r}")
    return host.strip("[]"), int(port)


def build_ha_config(cfg, secret: bytes, addr: str = "") -> HAConfig:
    """HAConfig from the broker config (HAConfigError lists every problem); addr is the
    advertised remoting address the HA handshake carries (node/replication/static_group.py)."""
    s = cfg.ha
    return HAConfig(node_id=s.node_id or str(cfg.broker_id), broker_id=cfg.broker_id,
                    advertised_addr=addr,
                    cluster=s.cluster or f"{cfg.cluster_name}/{cfg.broker_name}",
                    secret=secret, replication_mode=s.replication_mode,
                    min_in_sync_replicas=s.min_in_sync_replicas, max_gap_bytes=s.max_gap_bytes,
                    max_lag_ms=s.max_lag_ms, heartbeat_interval_ms=s.heartbeat_interval_ms,
                    peer_timeout_ms=s.peer_timeout_ms,
                    bootstrap_rate_bytes_per_s=s.bootstrap_rate_bytes_per_s,
                    listen_host=s.listen_host, listen_port=s.listen_port)


def config_problems(cfg) -> list[str]:
    """Problems of the [ha] table (node/config.py reports them with the others)."""
    s, p = cfg.ha, []
    if s.role not in ROLES:
        return [f"ha.role={s.role!r}: one of {', '.join(ROLES)}"]
    if (s.role == "cluster") != bool(cfg.zookeeper.hosts):
        p.append("cluster mode needs both zookeeper.hosts and ha.role=cluster")
    if s.role == "standalone":
        return p
    if s.role == "MASTER" and cfg.broker_id != 0:
        p.append("ha.role=MASTER needs broker_id 0")
    if s.role == "SLAVE":
        if cfg.broker_id <= 0:
            p.append("ha.role=SLAVE needs broker_id > 0")
        try:
            parse_addr(s.master_addr)
        except ValueError as exc:
            p.append(f"ha.master_addr: {exc}")
    if s.listen_host in ("0.0.0.0", "::", "") and not s.advertised_host:
        p.append("ha.advertised_host is required when ha.listen_host is a wildcard address")
    if s.advertised_host and (len(s.advertised_host) > 253 or
                              any(ch in s.advertised_host for ch in " /[]@")):
        p.append(f"ha.advertised_host={s.advertised_host[:60]!r} is not a host name or address")
    if s.slave_timeout_ms <= 0 or s.state_batch_ms < 0 or s.suggest_slave_lag_bytes < 0:
        p.append("ha.slave_timeout_ms must be > 0, ha.state_batch_ms and "
                 "ha.suggest_slave_lag_bytes >= 0")
    try:
        secret = read_secret(s)
    except SecretError as exc:
        p.append(str(exc))
        secret = b"x" * 16  # check the other keys all the same
    try:
        build_ha_config(cfg, secret)
    except HAConfigError as exc:
        p.extend(f"ha: {x}" for x in exc.problems)
    return p


def store_config(cfg):
    """The store config a broker opens: external confirmation when replicated (rule 1)."""
    if cfg.ha.role == "standalone":
        return cfg.store
    return dataclasses.replace(cfg.store, confirm_mode="external")


class ReplicaRole:
    """node/replication/roles.py's Role for a replicated broker."""

    def __init__(self, replication, broker_id: int):
        self.replication = replication
        self.broker_id = broker_id

    @property
    def writable(self) -> bool:
        return self.replication.is_master

    @property
    def state_ready(self) -> bool:
        """Writable and settled (rule 6): delayed delivery and transactions may serve."""
        return self.replication.is_master and self.replication.state_settled()


class Replication:
    def __init__(self, cfg, store, addr: str = ""):
        self.cfg = cfg
        self.section = cfg.ha
        self.store = store
        self.config = build_ha_config(cfg, read_secret(cfg.ha), addr)
        self.service = HAService(self.config, store)
        self.service.server_ssl, self.service.client_ssl = ha_tls(cfg)  # None = plain
        self.sync_master = self.config.replication_mode == SYNC_MASTER
        self.slave_timeout_s = self.section.slave_timeout_ms / 1000
        self.suggest_lag_bytes = self.section.suggest_slave_lag_bytes or HOT_BYTES
        self.master_addr: tuple[str, int] | None = None
        self.state = None              # node/replication/replicated_state.py, set by the broker
        self._settle_at: int | None = None  # log end when this node became master (rule 6)
        self._coordinator_on_fenced = None
        self.service.on_fenced_callback = self._fenced
        store.put_refusal = "this broker has no replication role yet"
        store.after_put = self.service.notify_appended        # rule 3
        self.dedup_shadow = ShadowWindow(cfg.dedup_window_ms, cfg.dedup_window_keys)  # rule 8
        self._shadow_task: asyncio.Task | None = None
        self._shadow_pass: asyncio.Future | None = None
        self._on_cut = None      # the store's cut listener this object chained in

    # -- roles -----------------------------------------------------------------------------
    async def start(self) -> None:
        """The static role from config (rule 4)."""
        if self.section.role == "MASTER":
            await self.become_master(self.service.last_epoch + 1)
        elif self.section.role == "SLAVE":
            await self.follow(parse_addr(self.section.master_addr), self.service.last_epoch)

    def set_coordinator(self, isr_factory, on_fenced) -> None:
        """The coordinator owns the in-sync set and hears of newer epochs."""
        self.service.isr_factory = isr_factory
        self._coordinator_on_fenced = on_fenced

    async def become_master(self, epoch: int) -> str:
        self.store.put_refusal = "this broker is becoming master"
        await self._stop_shadow()
        await self._offer_shadow()                          # rule 8
        await self.service.become_master(epoch)
        self.master_addr = None
        self.store.put_refusal = None                       # rule 2
        self._settle_at = self.store.max_offset             # rule 6
        if self.state is not None:
            self.state.on_become_master()
        log.info("replication: master of epoch %d", epoch)
        return self.ha_addr

    @property
    def ha_addr(self) -> str:
        """host:port slaves should dial: ha.advertised_host, else the listen host (a wildcard
        listen host is refused without an advertised one, config_problems)."""
        host = self.cfg.ha.advertised_host or self.config.listen_host
        if ":" in host:
            host = f"[{host}]"  # IPv6 literal: parse_addr strips the brackets
        return f"{host}:{self.service.listen_port}"

    async def follow(self, master_addr: tuple[str, int], epoch: int) -> None:
        self.store.put_refusal = (f"this broker is a slave of {master_addr[0]}:{master_addr[1]}; "
                                  f"only the master takes writes")
        if self.state is not None:
            self.state.on_follow()
        await self._stop_shadow()
        self.dedup_shadow.withdraw(self.store)   # an unadopted offer: the log may be cut
        await self.service.follow(master_addr, epoch)
        self.master_addr = master_addr
        self._start_shadow()

    def fence(self) -> None:
        self.store.put_refusal = "this master was fenced: a newer epoch exists"
        self.service.fence()

    def watch_master_link(self, fn) -> None:
        """The coordinator's fast-failover signal (coordinator/fast_failover.py)."""
        self.service.on_link_lost = fn

    async def step_down(self) -> None:
        self.store.put_refusal = "this broker gave up its replication role"
        await self._stop_shadow()
        self.dedup_shadow.withdraw(self.store)
        await self.service.stop()

    # -- the duplicate window's shadow (rule 8) --------------------------------------------
    def _start_shadow(self) -> None:
        if not self.dedup_shadow.enabled or self._shadow_task is not None:
            return
        if self.store.cut_listener is not self._on_cut:   # every cut voids the shadow
            before = self.store.cut_listener

            def on_cut(offset: int) -> None:
                self.dedup_shadow.note_cut(offset)
                if before is not None:
                    before(offset)
            self._on_cut = self.store.cut_listener = on_cut
        self._shadow_task = asyncio.get_running_loop().create_task(self._shadow_loop(),
                                                                    name="dedup-shadow")

    async def _shadow_loop(self) -> None:
        while True:
            try:
                await self._shadow_refresh()
            except Exception:   # a bad record must not end the loop; the send path rebuilds
                log.exception("duplicate-window shadow pass failed")
                self.dedup_shadow.reset()
            await asyncio.sleep(SHADOW_REFRESH_S)

    async def _shadow_refresh(self) -> None:
        """One pass in a worker thread; a pass already running is awaited, not doubled."""
        if self._shadow_pass is None or self._shadow_pass.done():
            self._shadow_pass = asyncio.ensure_future(
                asyncio.to_thread(self.dedup_shadow.refresh, self.store))
        await asyncio.shield(self._shadow_pass)

    async def _offer_shadow(self) -> None:
        """Catch the shadow up with the last entries and hand it to the send path. A shadow
        not built yet is not waited for (a full pass takes long: promotion must not), and on
        a failure the send path walks the index itself (correct, only slower)."""
        if not self.dedup_shadow.built:
            if self.dedup_shadow.enabled:
                log.info("duplicate-window shadow not built yet; the first write rebuilds it")
            return
        try:
            await self._shadow_refresh()
        except Exception:
            log.exception("duplicate-window shadow pass failed; the first write rebuilds it")
            self.dedup_shadow.reset()
            return
        self.dedup_shadow.offer(self.store)

    async def _stop_shadow(self) -> None:
        """End the pass loop; a pass running in its thread is aborted and awaited."""
        task, self._shadow_task = self._shadow_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._shadow_pass is not None:
            self.dedup_shadow.abort_pass()
            await asyncio.gather(self._shadow_pass, return_exceptions=True)
            self.dedup_shadow.abort_pass(False)

    async def stop(self) -> None:
        if self.state is not None and self.is_master:
            self.state.flush()   # the last offset changes reach the log (and the slaves)
        await self.step_down()

    def _fenced(self, epoch: int) -> None:
        self.store.put_refusal = f"this master was fenced by epoch {epoch}"
        if self._coordinator_on_fenced is not None:
            self._coordinator_on_fenced(epoch)

    # -- request path ----------------------------------------------------------------------
    @property
    def is_master(self) -> bool:
        return self.service.role == MASTER

    @property
    def role_name(self) -> str:
        return self.service.role

    def write_refusal(self) -> str | None:
        svc = self.service
        if svc.role == MASTER:
            if svc.can_accept_write():
                return None
            return (f"not enough in-sync replicas: {svc.in_sync_size} of "
                    f"min_in_sync_replicas={self.config.min_in_sync_replicas}; nothing stored")
        if svc.role == SLAVE:
            where = f" at {self.master_addr[0]}:{self.master_addr[1]} (HA)" \
                if self.master_addr else ""
            return (f"broker {self.cfg.broker_name} id {self.cfg.broker_id} is a slave, not the "
                    f"master{where}; send to the master")
        if svc.role == FENCED:
            return "this master was fenced by a newer epoch; it takes no more writes"
        return "this broker has no replication role yet (not master)"

    def state_settled(self) -> bool:
        """Rule 6: a master whose log, as held when it became master, is dispatched and its
        replicated state applied (the replicated snapshot is written then)."""
        if self._settle_at is None:
            return True
        if self.store.dispatcher.dispatched_offset < self._settle_at:
            return False
        self._settle_at = None
        if self.state is not None:
            self.state.on_settled()
        log.info("replication: the log held at promotion is dispatched; state settled")
        return True

    def notify_appended(self) -> None:
        self.service.notify_appended()

    def when_replicated(self, end_offset: int, callback) -> None:
        self.service.when_replicated(end_offset, self.slave_timeout_s, callback)

    def suggest_broker_id(self, max_phys_offset: int) -> int:
        """Pull redirection (RocketMQ's rule): while a consumer reads further than
        suggest_lag_bytes behind the log end, a master points it at an in-sync slave and a
        static slave that keeps up with its master keeps it (its own id); otherwise 0, back
        to the master. Static groups number slaves by their configured broker id
        (node/replication/static_group.py); cluster mode keeps its numeric-node-id rule below."""
        svc = self.service
        far = self.store.max_offset - max_phys_offset > self.suggest_lag_bytes
        if not far or svc.role not in (MASTER, SLAVE):
            return 0
        static = self.section.role in ("MASTER", "SLAVE")
        if svc.role == SLAVE:
            keeps_up = svc.lag_bytes <= self.suggest_lag_bytes
            return self.cfg.broker_id if static and keeps_up and self.cfg.broker_id > 0 else 0
        if static:
            stats = svc.slave_stats
            ids = [bid for node, (bid, _addr) in slave_broker_ids(svc.slave_endpoints).items()
                   if stats.get(node, {}).get("in_sync") and stats[node].get("connected")]
            return min(ids) if ids else 0
        for node, st in sorted(self.service.slave_stats.items()):
            if st["in_sync"] and st["connected"] and node.isdigit() and int(node) > 0:
                return int(node)
        return 0

    # -- metrics / coordinator -------------------------------------------------------------
    @property
    def listen_port(self) -> int:
        return self.service.listen_port if self.service.role in (MASTER, FENCED) else 0

    def progress(self) -> dict:
        svc, store = self.service, self.store
        return {"role": svc.role, "epoch": svc.epoch, "last_epoch": svc.last_epoch,
                "max_offset": store.max_offset, "acked_offset": svc.acked_offset,
                "confirmed_offset": store.confirmed_offset}

    def metrics(self) -> dict:
        m = self.service.metrics()
        client = self.service.slave_client
        m["slave_last_error"] = client.last_error if client is not None else None
        return m
