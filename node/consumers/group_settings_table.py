"""The subscription-group configs an operator stored (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, 200),
kept one file per group: `<store root>/config/subscriptionGroups/<group>.json`, holding the
config's JSON (node/consumers/group_settings.py). A name too long for a file name (over
FILE_NAME_MAX_CHARS) is kept as `~<sha256 of the name>.json` (`~` is outside the group
character set, so the two forms never meet); the group name is always read from the content.

Rules:
1. Incremental: a change writes (atomically: tmp + fsync + rename + fsync dir) or removes that
   group's file only, never the whole table; it is persisted before it is visible.
2. Bounded: at most `max_groups` stored configs; a new one past the bound is refused.
3. A group without a stored config gets the defaults (retryMaxTimes = the broker's
   max_reconsume_times).
4. Loading skips (and logs) a file that is unreadable or fails the checks; the others load.
5. `listeners` get the complete config after each store made here (not after a replicated
   one): replication writes it to the log.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os

from tidemq.node.consumers import group_settings as gs

log = logging.getLogger("tidemq.groups")

FILE_NAME_MAX_CHARS = 200


class GroupTableFull(Exception):
    """More stored configs than max_groups."""


class GroupSettingsTable:
    def __init__(self, root_dir: str, fs, max_groups: int, retry_max_times: int):
        self.dir = os.path.join(root_dir, "config", "subscriptionGroups")
        self._fs = fs
        self.max_groups = max_groups
        self.default_retry_max_times = retry_max_times
        self.table: dict[str, dict] = {}
        self.listeners: list = []

    def load(self) -> None:
        try:
            names = sorted(n for n in os.listdir(self.dir) if n.endswith(".json"))
        except FileNotFoundError:
            return
        for name in names:
            try:
                with open(os.path.join(self.dir, name), "rb") as f:
                    doc = json.loads(f.read())
                changes = gs.checked_changes(doc)
            except (OSError, ValueError, RecursionError) as exc:
                log.error("subscription group file %s skipped: %s", name, exc)
                continue
            group = changes["groupName"]
            self.table[group] = gs.merged(self.effective(group), changes)
        log.info("%d subscription group configs loaded", len(self.table))

    # -- reads ------------------------------------------------------------------------------
    def effective(self, group: str) -> dict:
        """The stored config, else the defaults (rule 3)."""
        conf = self.table.get(group)
        return dict(conf) if conf is not None else gs.defaults(group, self.default_retry_max_times)

    def retry_max_times(self, group: str) -> int:
        conf = self.table.get(group)
        return self.default_retry_max_times if conf is None else conf["retryMaxTimes"]

    def pull_refusal(self, group: str, message_model: str | None) -> str | None:
        """Why a pull of `group` is refused (NO_PERMISSION remarks as Java's), else None."""
        conf = self.table.get(group)
        if conf is None:
            return None
        if not conf["consumeEnable"]:
            return f"subscription group no permission, {group}"
        if not conf["consumeBroadcastEnable"] and message_model == "BROADCASTING":
            return f"the consumer group[{group}] can not consume by broadcast way"
        return None

    # -- changes ----------------------------------------------------------------------------
    def update(self, changes: dict, *, notify: bool = True) -> dict:
        """Store `changes` (checked by group_settings.checked_changes) over the current config;
        the complete config stored. GroupTableFull past the bound; OSError if not written."""
        group = changes["groupName"]
        if group not in self.table and len(self.table) >= self.max_groups:
            raise GroupTableFull(f"the broker holds max_subscription_groups={self.max_groups} "
                                 f"subscription group configs")
        conf = gs.merged(self.effective(group), changes)
        os.makedirs(self.dir, exist_ok=True)
        self._fs.write_atomic(self._path(group), json.dumps(conf, sort_keys=True).encode())
        self.table[group] = conf
        if notify:
            for fn in self.listeners:
                fn(conf)
        return conf

    def remove(self, group: str) -> bool:
        """Drop the group's stored config; whether there was one. (Replication carries it as
        the group's deletion record: node/replication/replicated_state.py.)"""
        if group not in self.table:
            return False
        self._fs.remove(self._path(group))
        self._fs.fsync_dir(self.dir)
        del self.table[group]
        return True

    def _path(self, group: str) -> str:
        if len(group) <= FILE_NAME_MAX_CHARS:
            return os.path.join(self.dir, group + ".json")
        return os.path.join(self.dir, "~" + hashlib.sha256(group.encode()).hexdigest() + ".json")
