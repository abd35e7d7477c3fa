"""Chooses, once at import, between the compiled codec functions (client/protocol/_speedups.c)
and their pure-Python twins.

A module defines the pure function and publishes `accel.pick(pure)`: the compiled function of
the same name when the extension is built and not disabled, else `pure` itself. Every pure
twin stays registered in PURE, so tests can run both on the same input.

Rules:
1. TIDEMQ_PURE_PYTHON=1 (any value but "" or "0") forces the pure functions; it is read once,
   when this module is first imported.
2. A missing or unloadable extension (no C compiler at install time) silently means pure
   Python: the results are the same, only slower.
3. A constant a compiled twin needs but Python owns (a table of names) is handed over with
   `provide`; a twin that finds it missing falls back to pure Python.
4. The compiled function handles the common valid input and calls its registered twin for
   anything else, so both give byte-identical output and the same exceptions
   (tests/protocol/test_speedups_equivalence.py).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

PURE_FORCED = os.environ.get("TIDEMQ_PURE_PYTHON", "") not in ("", "0")

_speedups: ModuleType | None = None
if not PURE_FORCED:
    try:
        from . import _speedups  # type: ignore[attr-defined,no-redef]
    except ImportError:  # not built here: the pure twins serve (rule 2)
        _speedups = None

COMPILED = _speedups is not None
PURE: dict[str, Callable[..., Any]] = {}  # name -> pure-Python twin, whichever path is in use
PROVIDED: dict[str, Any] = {}  # name -> a constant the compiled twins read (owned by Python)
F = TypeVar("F", bound=Callable[..., Any])


def pick(pure: F) -> F:
    """The compiled twin of `pure` when in use (registering `pure` as its fallback), else pure."""
    name = pure.__name__
    PURE[name] = pure
    if _speedups is None:
        return pure
    _speedups.set_fallback(name, pure)
    compiled: F = getattr(_speedups, name)
    return compiled


def provide(name: str, value: Any) -> None:
    """Hand the compiled twins a constant whose source of truth is Python (a table of names):
    kept in PROVIDED so tests can hand it to the extension when pure is forced."""
    PROVIDED[name] = value
    if _speedups is not None:
        _speedups.set_fallback(name, value)


def compiled_module() -> ModuleType | None:
    """The extension module, or None; importable for tests even when pure is forced."""
    if _speedups is not None:
        return _speedups
    try:
        from . import _speedups as mod  # type: ignore[attr-defined]
    except ImportError:
        return None
    module: ModuleType = mod
    return module
