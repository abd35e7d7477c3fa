"""Frame -> typed request, once, before the ACL and the processor run.

Each row of the request table (node/requests/table.py) is compiled once into a parser, a
straight-line function with one block per field (no per-request loop over the table, no
reflection): the send codes are the hot path. A parser returns an instance of the row's
request class (a slots dataclass, one attribute per field, plus `body` when the row decodes
one) or raises RequestError, the one inbound error type: 1 SYSTEM_ERROR with a remark naming
the field and the rule, before anything changed.

Duplicate names: a field that may be sent under two names (a send's `topic` and `b`) and is
sent under both with different values is refused; the same value twice ("true" and "1" are
the same bool) is accepted. So the ACL and the processor can never read different values for
one field.

Fast path (compiled builds): a row without a body whose fields are all Int (min <= 0), Text,
Name or Bool gets a plan (`fast_plan`), and its parser first asks the compiled `typed_request`
(one call instead of a dict lookup per name and a check per field) for the request; its pure
twin, slower than the generated blocks, serves only as the reference. That answers
only the usual header: each field under at most one of its names, plain ASCII digits for an
integer, "true"/"false" for a bool, a name this kind already accepted (the memo), text within
its limit. For anything else it answers None and the generated blocks decide, so the results
and refusals are the generated parser's in every case.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import make_dataclass
from typing import Any

from tidemq.node.requests.fields import Bool, Int, Name, RequestError, Text
from tidemq.node.requests.table import SPECS, Spec
from tidemq.protocol import accel

# Shorter than these, ASCII digits are always inside the kind's range (int32 has 10 digits).
_SAFE_DIGITS = {32: 10, 64: 19}
_NAMES_MEMO_MAX = 16384  # valid names remembered per name kind (each at most 262 characters)
_names_ok: dict[object, set] = {}  # Name kind -> names it accepted (kinds are frozen values)
# typed_request's field operations (fast_plan)
OP_TEXT, OP_NAME, OP_INT, OP_BOOL = 0, 1, 2, 3


def _field_block(i: int, field, code: int, spec) -> list[str]:
    spec_name = spec.name
    first, *others = field.names[::-1] if spec.letters_first else field.names
    label = "/".join(field.names)
    v = f"v{i}"
    lines = [f"    {v} = get({first!r})"]
    for other in others:
        lines += [f"    w = get({other!r})",
                  "    if w is not None:",
                  f"        if {v} is None: {v} = w",
                  f"        elif w != {v} and k{i}({label!r}, w) != k{i}({label!r}, {v}):",
                  f"            raise RequestError({_dup_remark(field.names)!r})"]
    if field.required:
        missing = f"request {code} {spec_name}: header field {label} is missing"
        lines += [f"    if {v} is None: raise RequestError({missing!r})"]
    else:
        lines += [f"    if {v} is None: {v} = d{i}", "    else:"]
    pad = "    " if field.required else "        "
    return lines + [pad + line for line in _convert_lines(i, field, label)]


def _convert_lines(i: int, field, label: str) -> list[str]:
    """The conversion of v<i>, inlined for the usual case; k<i> (the kind's convert) decides
    and words the refusal otherwise."""
    kind, v = field.kind, f"v{i}"
    slow = f"k{i}({label!r}, {v})"
    if isinstance(kind, Int) and (kind.min is None or kind.min <= 0):
        safe = _SAFE_DIGITS[kind.bits]  # digits only: never below a min of 0
        return [f"{v} = int({v}) if {v}.isdigit() and {v}.isascii() and len({v}) < {safe} "
                f"else {slow}"]
    if isinstance(kind, Text):
        return [f"if len({v}) > {kind.max_chars}: {slow}"]
    if isinstance(kind, Bool):
        return [f"{v} = {v} == 'true' or {v} == '1' or {v}.lower() == 'true'"]
    if isinstance(kind, Name):  # names repeat: a bounded memo of the ones already checked
        return [f"if {v} not in ok{i}:",
                f"    {slow}",
                f"    if {v} and len(ok{i}) < {_NAMES_MEMO_MAX}: ok{i}.add({v})"]
    return [f"{v} = {slow}"]


def _dup_remark(names) -> str:
    return (f"header field {names[0]} is given under several names ({', '.join(names)}) with "
            f"different values; send it once")


def fast_plan(spec: Spec) -> tuple | None:
    """typed_request's plan of a row, one (first name, other name or None, operation, its
    argument, required, default) per field; None when a field's kind has no fast form."""
    if spec.body is not None:
        return None
    plan = []
    for field in spec.fields:
        kind = field.kind
        arg: object = None
        if isinstance(kind, Int) and (kind.min is None or kind.min <= 0):
            op, arg = OP_INT, _SAFE_DIGITS[kind.bits]
        elif isinstance(kind, Text):
            op, arg = OP_TEXT, kind.max_chars
        elif isinstance(kind, Name):
            op, arg = OP_NAME, _names_ok.setdefault(kind, set())
        elif isinstance(kind, Bool):
            op = OP_BOOL
        else:
            return None
        names = field.names[::-1] if spec.letters_first else field.names
        if len(names) > 2:
            return None
        plan.append((names[0], names[1] if len(names) == 2 else None, op, arg, field.required,
                     field.default))
    return tuple(plan)


def typed_request(ext, plan, cls):
    """cls(*values) of the header `ext` by `plan` (fast_plan) when every field is usual (see
    the module's fast path), else None. A compiled twin when built."""
    if ext.__class__ is not dict:
        return None
    values = []
    for first, other, op, arg, required, default in plan:
        v = ext.get(first)
        if other is not None:
            w = ext.get(other)
            if w is not None:
                if v is not None:
                    return None  # under both names: the generated block compares them
                v = w
        if v is None:
            if required:
                return None
            values.append(default)
            continue
        if v.__class__ is not str:
            return None
        if op == OP_INT:
            if not (v.isdigit() and v.isascii() and len(v) < arg):
                return None
            v = int(v)
        elif op == OP_TEXT:
            if len(v) > arg:
                return None
        elif op == OP_NAME:
            if v not in arg:
                return None
        elif v == "true":
            v = True
        elif v == "false":
            v = False
        else:
            return None
        values.append(v)
    return cls(*values)


typed_request = accel.pick(typed_request)
# The pure twin is slower than the generated blocks it would spare: pure Python skips it.
_FAST = typed_request if accel.COMPILED else None


def compile_spec(code: int, spec: Spec, fast: Callable[..., Any] | None = _FAST):
    """The parser of one table row: fn(cmd) -> request object. `fast`: the typed_request
    function its fast path calls, None for none (tests compare them)."""
    attrs = [f.attr for f in spec.fields] + (["body"] if spec.body is not None else [])
    cls = make_dataclass(spec.name.title().replace("_", "") + "Request", attrs, slots=True)
    plan = fast_plan(spec) if fast is not None else None
    env: dict[str, Any] = {"cls": cls, "RequestError": RequestError, "body_fn": spec.body,
                           "fast": fast, "plan": plan}
    lines = ["def parse(cmd):"]
    if plan is not None:
        lines += ["    req = fast(cmd.ext, plan, cls)", "    if req is not None: return req"]
    lines += ["    get = cmd.ext.get"]
    for i, field in enumerate(spec.fields):
        env[f"k{i}"] = field.kind.convert
        env[f"d{i}"] = field.default
        env[f"ok{i}"] = _names_ok.setdefault(field.kind, set())
        lines += _field_block(i, field, code, spec)
    args = [f"v{i}" for i in range(len(spec.fields))]
    if spec.body is not None:
        args.append("body_fn(cmd.body)")
    lines.append(f"    return cls({', '.join(args)})")
    exec(compile("\n".join(lines), f"<request parser {code}>", "exec"), env)  # noqa: S102
    parse = env["parse"]
    parse.request_class = cls
    return parse


PARSERS = {int(code): compile_spec(int(code), spec) for code, spec in SPECS.items()}


def parse_request(cmd):
    """The typed request of `cmd` (its code must be in the table); RequestError if refused."""
    return PARSERS[cmd.code](cmd)
