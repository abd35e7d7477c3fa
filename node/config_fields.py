"""Helpers shared by the config sections (node/config.py, node/security/settings.py): a documented
dataclass field, and the "a configured file must exist" check, so each rule is written once."""
from __future__ import annotations

import os
from dataclasses import field


def config_field(default, doc: str, **meta):
    """A dataclass field with its `--describe-config` text (and flags such as secret=True)."""
    return field(default=default, metadata={"doc": doc, **meta})


def missing_file(key: str, path: str) -> list[str]:
    """[problem] when `path` is set but is not a regular file, else []. The message names the
    key and the path (never a file's content)."""
    if path and not os.path.isfile(path):
        return [f"{key} {path!r} does not exist"]
    return []
