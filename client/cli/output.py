"""How the `tidemq` CLI prints: JSON for scripts, tables for people, progress on stderr.

    -o json    one JSON document on stdout (the default when stdout is not a terminal)
    -o table   aligned text: scalars as `key: value`, lists of records as tables, nested
               records under a heading (the default on a terminal)

Rules:
1. The JSON form is the contract for scripts: keys never depend on the output mode.
2. Progress lines go to stderr, only when stderr is a terminal, at most once a second, and
   are erased before the result is printed.
3. Values are shown as they are; None prints as "-", lists of scalars comma-separated; a
   column of records (a group's members) is expanded into one row per record.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

MODES = ("auto", "json", "table")


def resolve(mode: str, stream: TextIO | None = None) -> str:
    stream = stream or sys.stdout
    if mode in ("json", "table"):
        return mode
    return "table" if _isatty(stream) else "json"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def emit(result: object, mode: str, stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    if resolve(mode, stream) == "json":
        print(json.dumps(result, sort_keys=True), file=stream, flush=True)
    else:
        print(render(result).rstrip("\n"), file=stream, flush=True)


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)) and all(not isinstance(x, (dict, list)) for x in v):
        return ",".join(_cell(x) for x in v) or "-"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


def _flatten(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A column holding records (a group's members) becomes one row per record, the parent's
    other fields repeated."""
    out: list[dict[str, Any]] = []
    for r in rows:
        nested = [k for k, v in r.items() if isinstance(v, list) and v
                  and all(isinstance(x, dict) for x in v)]
        if not nested:
            out.append(r)
            continue
        base = {k: v for k, v in r.items() if k != nested[0]}
        out.extend(_flatten([dict(base, **child) for child in r[nested[0]]]))
    return out


def _header(name: str) -> str:
    """snake_case or camelCase -> SNAKE_CASE."""
    return "".join("_" + c if c.isupper() and i and name[i - 1].islower() else c
                   for i, c in enumerate(name)).upper()


def table(rows: list[dict[str, Any]]) -> str:
    rows = _flatten(rows)
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols and not isinstance(r[k], (dict,)))
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    heads = [_header(c) for c in cols]
    widths = [max(w, len(h)) for w, h in zip(widths, heads)]
    head = "  ".join(h.ljust(w) for h, w in zip(heads, widths))
    body = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join([head.rstrip()] + body) + "\n"


def render(result: object, indent: str = "") -> str:
    if not isinstance(result, dict):
        return indent + _cell(result) + "\n"
    out: list[str] = []
    later: list[tuple[str, str]] = []
    for k in sorted(result):
        v = result[k]
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            later.append((k, table(v)))
        elif isinstance(v, dict) and v and any(isinstance(x, (dict, list)) for x in v.values()):
            later.append((k, render(v, indent + "  ")))
        elif isinstance(v, dict) and v:
            later.append((k, "".join(f"{indent}  {kk}: {_cell(vv)}\n" for kk, vv in sorted(v.items()))))
        else:
            out.append(f"{indent}{k}: {_cell(v)}\n")
    for k, text in later:
        out.append(f"{indent}{k}:\n")
        out.append("".join(indent + "  " + line + "\n" for line in text.rstrip("\n").split("\n"))
                   if not text.startswith(indent + "  ") else text)
    return "".join(out)


class Progress:
    """Rule 2: `tick(done, total)` draws `what: done/total (rate/s)` on a terminal."""

    def __init__(self, what: str, stream: TextIO | None = None, interval_s: float = 1.0) -> None:
        self.what, self.stream, self.interval_s = what, stream or sys.stderr, interval_s
        self.enabled = _isatty(self.stream)
        self.start = self._last = time.monotonic()
        self._drawn = False

    def tick(self, done: int, total: int | None = None) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < self.interval_s:
            return
        self._last = now
        rate = done / (now - self.start) if now > self.start else 0.0
        of = f"/{total}" if total else ""
        self.stream.write(f"\r{self.what}: {done}{of} ({rate:,.0f}/s)   ")
        self.stream.flush()
        self._drawn = True

    def clear(self) -> None:
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = False
