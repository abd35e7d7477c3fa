"""RocketMQ's SQL92 message filter: a tokenizer and a recursive-descent parser that compile an
expression over message properties into a predicate `props -> bool`. Pure, stdlib only.

Grammar (keywords case-insensitive):
    expr      := or
    or        := and ("OR" and)*
    and       := not ("AND" not)*
    not       := "NOT" not | predicate
    predicate := "(" expr ")" | TRUE | FALSE
               | operand cmp operand                       cmp: = <> != > >= < <=
               | operand [NOT] BETWEEN operand AND operand
               | operand [NOT] IN "(" literal ("," literal)* ")"
               | operand IS [NOT] NULL
               | operand [NOT] (CONTAINS | STARTSWITH | ENDSWITH) string
    operand   := identifier | 'string' ('' escapes a quote) | number | TRUE | FALSE | NULL

Rules:
1. An identifier names a message property (user properties and system ones such as TAGS and
   KEYS); a missing property is NULL. Property values are strings.
2. Comparison with a number compares numerically: a property that is not a number makes the
   comparison unknown. <, >, <=, >= and BETWEEN take numbers only (a string literal there is a
   parse error, as in RocketMQ); = and <> compare strings with strings, numbers with numbers.
3. Three-valued logic as in SQL: NULL or unknown operands make a comparison unknown; NOT of
   unknown is unknown; a message matches only when the whole expression is TRUE.
4. Bad input raises Sql92Error with a message naming the position; nothing else escapes.
   Expressions are bounded (MAX_EXPRESSION_CHARS, MAX_DEPTH) so no input can exhaust the stack.
"""
from __future__ import annotations

import re
from collections.abc import Callable

MAX_EXPRESSION_CHARS = 8192
MAX_DEPTH = 64
_CACHE_MAX = 1024

Predicate = Callable[[dict], bool]


class Sql92Error(ValueError):
    """The expression is not valid SQL92 filter syntax."""


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>'(?:[^']|'')*')
  | (?P<num>[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[lLdDfF]?)
  | (?P<id>[A-Za-z_$][A-Za-z0-9_$.]*)
  | (?P<op><>|!=|>=|<=|=|>|<|\(|\)|,)
""", re.VERBOSE)
_KEYWORDS = {"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE",
             "CONTAINS", "STARTSWITH", "ENDSWITH"}


def tokenize(text: str) -> list[tuple[str, object, int]]:
    """(kind, value, position) triples; kinds: str, num, id, kw, op, end."""
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise Sql92Error(f"unexpected character {text[pos]!r} at position {pos}")
        kind, raw = m.lastgroup, m.group()
        if kind == "str":
            out.append(("str", raw[1:-1].replace("''", "'"), pos))
        elif kind == "num":
            out.append(("num", _number(raw, pos), pos))
        elif kind == "id":
            up = raw.upper()
            out.append(("kw", up, pos) if up in _KEYWORDS else ("id", raw, pos))
        elif kind == "op":
            out.append(("op", "<>" if raw == "!=" else raw, pos))
        pos = m.end()
    out.append(("end", None, len(text)))
    return out


def _number(raw: str, pos: int):
    body = raw.rstrip("lLdDfF")
    try:
        if any(c in body for c in ".eE") or raw[-1] in "dDfF":
            return float(body)
        return int(body)
    except ValueError:
        raise Sql92Error(f"bad number {raw!r} at position {pos}") from None


def _as_number(value):
    """A property value (str) or literal as a number, else None (rule 2)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return None


class _Parser:
    def __init__(self, text: str):
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self):
        return self.tokens[self.i]

    def take(self):
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def accept(self, kind: str, value=None) -> bool:
        k, v, _ = self.peek()
        if k == kind and (value is None or v == value):
            self.i += 1
            return True
        return False

    def expect(self, kind: str, value=None):
        if not self.accept(kind, value):
            self.fail(f"expected {value or kind}")
        return self.tokens[self.i - 1]

    def fail(self, what: str):
        kind, value, pos = self.peek()
        found = "end of expression" if kind == "end" else repr(value)
        raise Sql92Error(f"{what} at position {pos}, found {found}")

    def parse(self):
        node = self.or_()
        if self.peek()[0] != "end":
            self.fail("unexpected token")
        return node

    def or_(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Sql92Error(f"expression nested deeper than {MAX_DEPTH}")
        parts = [self.and_()]
        while self.accept("kw", "OR"):
            parts.append(self.and_())
        self.depth -= 1
        return parts[0] if len(parts) == 1 else _or(parts)

    def and_(self):
        parts = [self.not_()]
        while self.accept("kw", "AND"):
            parts.append(self.not_())
        return parts[0] if len(parts) == 1 else _and(parts)

    def not_(self):
        if self.accept("kw", "NOT"):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise Sql92Error(f"expression nested deeper than {MAX_DEPTH}")
            inner = self.not_()
            self.depth -= 1
            return _not(inner)
        return self.predicate()

    def predicate(self):
        if self.accept("op", "("):
            node = self.or_()
            self.expect("op", ")")
            return node
        left = self.operand()
        kind, value, _ = self.peek()
        if kind == "op" and value in _CMP:
            self.take()
            return self.comparison(value, left, self.operand())
        negate = self.accept("kw", "NOT")
        kind, value, _ = self.peek()
        if kind == "kw" and value == "IS" and not negate:
            self.take()
            is_not = self.accept("kw", "NOT")
            self.expect("kw", "NULL")
            return _is_null(left, is_not)
        if self.accept("kw", "BETWEEN"):
            low = self.numeric_operand()
            self.expect("kw", "AND")
            node = _between(left, low, self.numeric_operand())
        elif self.accept("kw", "IN"):
            node = _in(left, self.in_list())
        elif kind == "kw" and value in _STRING_OPS:
            self.take()
            node = _string_op(value, left, self.expect("str")[1])
        elif left[0] == "lit" and isinstance(left[1], bool) and not negate:
            return lambda props, b=left[1]: b
        else:
            self.fail("expected a comparison operator")
        return _not(node) if negate else node

    def operand(self):
        kind, value, _ = self.take()
        if kind == "id":
            return ("prop", value)
        if kind in ("str", "num"):
            return ("lit", value)
        if kind == "kw" and value in ("TRUE", "FALSE"):
            return ("lit", value == "TRUE")
        if kind == "kw" and value == "NULL":
            return ("lit", None)
        self.i -= 1
        self.fail("expected a property name or a literal")

    def numeric_operand(self):
        operand = self.operand()
        if operand[0] == "lit" and not isinstance(operand[1], (int, float)) \
                or isinstance(operand[1], bool):
            self.i -= 1
            self.fail("expected a number")
        return operand

    def comparison(self, op: str, left, right):
        if op in ("=", "<>"):
            return _equal(left, right, op == "<>")
        for side in (left, right):
            if side[0] == "lit" and (not isinstance(side[1], (int, float))
                                     or isinstance(side[1], bool)):
                self.i -= 1
                self.fail(f"operator {op} compares numbers only")
        return _ordered(op, left, right)

    def in_list(self):
        self.expect("op", "(")
        values = []
        while True:
            kind, value, _ = self.take()
            if kind not in ("str", "num"):
                self.i -= 1
                self.fail("expected a string or number in the IN list")
            values.append(value)
            if self.accept("op", ")"):
                return values
            self.expect("op", ",")


_CMP = ("=", "<>", ">", ">=", "<", "<=")
_STRING_OPS = ("CONTAINS", "STARTSWITH", "ENDSWITH")
_ORDER = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
          "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}


def _getter(operand):
    """A function props -> value (str, number, bool or None) for an operand."""
    kind, value = operand
    if kind == "prop":
        return lambda props: props.get(value)
    return lambda props: value


def _equal(left, right, negate: bool):
    get_l, get_r = _getter(left), _getter(right)

    def test(props):
        a, b = get_l(props), get_r(props)
        if a is None or b is None:
            return None
        if isinstance(a, bool) or isinstance(b, bool):
            a = a if isinstance(a, bool) else str(a).lower() == "true"
            b = b if isinstance(b, bool) else str(b).lower() == "true"
        elif isinstance(a, (int, float)) or isinstance(b, (int, float)):
            a, b = _as_number(a), _as_number(b)
            if a is None or b is None:
                return None
        return (a != b) if negate else (a == b)
    return test


def _ordered(op: str, left, right):
    get_l, get_r, cmp = _getter(left), _getter(right), _ORDER[op]

    def test(props):
        a, b = _as_number(get_l(props)), _as_number(get_r(props))
        if a is None or b is None:
            return None
        return cmp(a, b)
    return test


def _between(operand, low, high):
    get, get_lo, get_hi = _getter(operand), _getter(low), _getter(high)

    def test(props):
        v, lo, hi = _as_number(get(props)), _as_number(get_lo(props)), _as_number(get_hi(props))
        if v is None or lo is None or hi is None:
            return None
        return lo <= v <= hi
    return test


def _in(operand, values):
    get = _getter(operand)
    strings = frozenset(v for v in values if isinstance(v, str))
    numbers = frozenset(v for v in values if not isinstance(v, str))

    def test(props):
        v = get(props)
        if v is None:
            return None
        if isinstance(v, str) and v in strings:
            return True
        return bool(numbers) and _as_number(v) in numbers
    return test


def _is_null(operand, negate: bool):
    get = _getter(operand)
    return lambda props: (get(props) is not None) if negate else (get(props) is None)


def _string_op(op: str, operand, literal: str):
    get = _getter(operand)
    method = {"CONTAINS": str.__contains__, "STARTSWITH": str.startswith,
              "ENDSWITH": str.endswith}[op]

    def test(props):
        v = get(props)
        if not isinstance(v, str):
            return None
        return method(v, literal)
    return test


def _not(inner):
    def test(props):
        v = inner(props)
        return None if v is None else not v
    return test


def _junction(parts, decisive: bool):
    """AND (decisive False) or OR (decisive True) in three-valued logic: the decisive value
    wins at once, else unknown if any part was unknown."""
    def test(props):
        unknown = False
        for part in parts:
            v = part(props)
            if v is decisive:
                return decisive
            unknown = unknown or v is None
        return None if unknown else not decisive
    return test


def _and(parts):
    return _junction(parts, False)


def _or(parts):
    return _junction(parts, True)


_cache: dict[str, Predicate] = {}


def compile_sql92(expression: str) -> Predicate:
    """The predicate of an expression (cached: subscriptions repeat on every pull). Raises
    Sql92Error for an empty, too long or malformed expression."""
    fn = _cache.get(expression)
    if fn is not None:
        return fn
    if not isinstance(expression, str) or not expression.strip():
        raise Sql92Error("empty SQL92 expression")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise Sql92Error(f"SQL92 expression longer than {MAX_EXPRESSION_CHARS} characters")
    node = _Parser(expression).parse()

    def predicate(props: dict) -> bool:
        return node(props) is True
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[expression] = predicate
    return predicate
