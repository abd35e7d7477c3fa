"""The broker's open-file limit, raised at start.

Consume queues share one database (node/store/unit_db.py), so the store's descriptors do not
grow with the queue count; client connections do (one each). At start the soft limit is raised
to the hard one (an unprivileged process may do so) and one INFO line says old -> new. When the
hard limit is still low, a WARNING says about how many connections fit: the limit less
store.min_free_fds (kept for the store's own files) less BASE_FDS for the process itself.
"""
from __future__ import annotations

import logging
import resource

log = logging.getLogger("tidemq.limits")
BASE_FDS = 32            # interpreter, logs, listening sockets, commit-log and index files
LOW_LIMIT = 4096         # below this the warning names the connection count it supports
_NR_OPEN = "/proc/sys/fs/nr_open"


def _ceiling(hard: int) -> int:
    """What the soft limit may become: the hard limit, or the kernel's nr_open if unlimited."""
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        with open(_NR_OPEN) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def raise_open_file_limit(min_free_fds: int) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _ceiling(hard)
    if soft == resource.RLIM_INFINITY or soft >= target:
        log.info("open-file limit is %s (the hard limit)", "unlimited"
                 if soft == resource.RLIM_INFINITY else soft)
        new = soft
    else:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            new = target
            log.info("open-file limit raised from %d to %d (RLIMIT_NOFILE soft to hard)",
                     soft, new)
        except (OSError, ValueError) as exc:
            new = soft
            log.warning("open-file limit stays %d: raising it to %d failed (%s)", soft, target,
                        exc)
    if new != resource.RLIM_INFINITY and new < LOW_LIMIT:
        fit = max(0, new - min_free_fds - BASE_FDS)
        log.warning("open-file limit %d is low: about %d client connections fit (one "
                    "descriptor each; store.min_free_fds=%d kept for the store's files); "
                    "raise the hard limit (ulimit -Hn, LimitNOFILE=, docker --ulimit nofile=)",
                    new, fit, min_free_fds)
    return new
