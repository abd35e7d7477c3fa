"""The SDK stays fully annotated and under mypy's strict settings.

Every function under client/ (the `tidemq` SDK) annotates each parameter and its return; only
the first parameter of a method (`self`, `cls`) may go bare. pyproject.toml checks the whole SDK
strictly through one `tidemq.*` pattern, resets only the server packages, and its type-debt
list names no SDK module.
"""
from __future__ import annotations

import ast
import os
import tomllib
from collections.abc import Iterator

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SDK_FOLDER = os.path.join(REPO, "client")
SERVER_PACKAGES = ("tidemq.node", "tidemq.ha", "tidemq.coordinator", "tidemq.pipeline")
STRICT_FLAGS = ("disallow_untyped_defs", "disallow_incomplete_defs", "disallow_untyped_calls",
                "check_untyped_defs", "disallow_any_generics", "warn_return_any")

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def sdk_files() -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(SDK_FOLDER):
        out += [os.path.join(dirpath, f) for f in files if f.endswith(".py")]
    return sorted(out)


def functions(tree: ast.AST) -> Iterator[tuple[FunctionNode, bool]]:
    """(function, defined directly in a class body?) for every def in the tree."""
    methods = {id(node) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
               for node in cls.body}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, id(node) in methods


def missing_annotations(fn: FunctionNode, is_method: bool) -> list[str]:
    """Names of the parts of `fn` left unannotated ("return" for the return)."""
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    if is_method and not static and positional:
        positional = positional[1:]  # self / cls
    params = [*positional, *args.kwonlyargs,
              *(a for a in (args.vararg, args.kwarg) if a is not None)]
    missing = [p.arg for p in params if p.annotation is None]
    if fn.returns is None:
        missing.append("return")
    return missing


def unannotated(path: str) -> list[str]:
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    rel = os.path.relpath(path, REPO)
    return [f"{rel}:{fn.lineno} {fn.name}: {', '.join(missing)}"
            for fn, is_method in functions(tree)
            if (missing := missing_annotations(fn, is_method))]


def test_every_sdk_function_is_annotated() -> None:
    files = sdk_files()
    assert os.path.join(SDK_FOLDER, "producer", "producer.py") in files
    problems = [p for path in files for p in unannotated(path)]
    assert not problems, "\n".join(problems)


def test_the_checker_spots_a_bare_parameter_and_a_missing_return() -> None:
    tree = ast.parse("class C:\n"
                     "    def m(self, a: int, b) -> None: ...\n"
                     "    @staticmethod\n"
                     "    def s(x): ...\n"
                     "def f(*args: int, **kw) -> int: ...\n"
                     "async def g(a: int): ...\n")
    found = {fn.name: missing_annotations(fn, m) for fn, m in functions(tree)}
    assert found == {"m": ["b"], "s": ["x", "return"], "f": ["kw"], "g": ["return"]}


def mypy_overrides() -> list[dict[str, object]]:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return list(tomllib.load(f)["tool"]["mypy"]["overrides"])


def patterns(section: dict[str, object]) -> list[str]:
    module = section["module"]
    return [module] if isinstance(module, str) else list(module)  # type: ignore[arg-type]


def is_server(pattern: str) -> bool:
    return any(pattern == p or pattern.startswith(p + ".") for p in SERVER_PACKAGES)


def test_mypy_checks_the_whole_sdk_strictly() -> None:
    sections = mypy_overrides()
    strict = [s for s in sections if "tidemq.*" in patterns(s)]
    assert len(strict) == 1 and all(strict[0].get(flag) is True for flag in STRICT_FLAGS)
    loosening = [p for s in sections if s is not strict[0]
                 and (s.get("ignore_errors") or any(s.get(f) is False for f in STRICT_FLAGS))
                 for p in patterns(s) if not is_server(p)]
    assert not loosening, f"SDK modules excused from strict checking: {loosening}"
