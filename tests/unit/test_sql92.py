"""The SQL92 filter: parsing, three-valued evaluation, clear errors, and bounded input."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.node.filter import FilterDisabled, FilterError, build, keep_matching
from tidemq.node.filter.sql92 import (
    MAX_DEPTH,
    MAX_EXPRESSION_CHARS,
    Sql92Error,
    compile_sql92,
    tokenize,
)

PROPS = {"a": "5", "b": "abc", "c": "2.5", "TAGS": "TagA", "flag": "true", "neg": "-3"}


@pytest.mark.parametrize("expr,expected", [
    ("a = 5", True), ("a = 6", False), ("a <> 6", True), ("a != 5", False),
    ("a > 4", True), ("a >= 5", True), ("a < 5", False), ("a <= 5", True),
    ("c > 2.4", True), ("c < 2.5", False), ("neg < -2", True), ("a > 1e0", True),
    ("a BETWEEN 1 AND 5", True), ("a BETWEEN 6 AND 9", False), ("a NOT BETWEEN 6 AND 9", True),
    ("b = 'abc'", True), ("b = 'ab'", False), ("b <> 'ab'", True),
    ("b IN ('x', 'abc')", True), ("b IN ('x')", False), ("b NOT IN ('x')", True),
    ("a IN (4, 5)", True),
    ("TAGS = 'TagA'", True), ("b IS NOT NULL", True), ("zz IS NULL", True), ("zz IS NOT NULL", False),
    ("a = 5 AND b = 'abc'", True), ("a = 5 AND b = 'x'", False), ("a = 6 OR b = 'abc'", True),
    ("NOT a = 6", True), ("NOT (a = 5 OR b = 'x')", False), ("TRUE", True), ("FALSE", False),
    ("a = 5 and (b = 'x' or c between 2 and 3)", True), ("flag = TRUE", True),
    ("b CONTAINS 'bc'", True), ("b STARTSWITH 'ab'", True), ("b ENDSWITH 'x'", False),
    ("b NOT CONTAINS 'z'", True),
])
def test_evaluates(expr, expected):
    assert compile_sql92(expr)(PROPS) is expected


@pytest.mark.parametrize("expr", [
    "zz = 1", "NOT zz = 1", "zz > 1", "b > 1", "zz BETWEEN 1 AND 2", "zz IN ('a')",
    "NOT zz IN ('a')", "zz = 1 OR FALSE", "b = 1",
])
def test_null_and_unknown_never_match(expr):
    """A missing property or a non-number in a numeric comparison is unknown, and so is NOT of
    it: such messages are filtered out, as in SQL."""
    assert compile_sql92(expr)(PROPS) is False


def test_unknown_or_true_matches():
    assert compile_sql92("zz = 1 OR a = 5")(PROPS) is True
    assert compile_sql92("zz = 1 AND a = 6")(PROPS) is False


@pytest.mark.parametrize("expr,where", [
    ("", "empty"), ("a =", "position 3"), ("a = 'x", "unexpected character"),
    ("a > 'x'", "compares numbers only"), ("a BETWEEN 'a' AND 'b'", "expected a number"),
    ("(a = 1", "expected )"), ("a = 1 b = 2", "unexpected token"), ("a", "comparison"),
    ("a IN ()", "IN list"), ("a IS NOT 5", "expected NULL"), ("a # 1", "unexpected character"),
    ("AND", "property name or a literal"),
])
def test_bad_expressions_raise_clear_errors(expr, where):
    with pytest.raises(Sql92Error) as info:
        compile_sql92(expr)
    assert where in str(info.value)


def test_bounds():
    with pytest.raises(Sql92Error, match="longer than"):
        compile_sql92("a = 1 OR " * (MAX_EXPRESSION_CHARS // 8) + "a = 1")
    with pytest.raises(Sql92Error, match="nested deeper"):
        compile_sql92("(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1))
    with pytest.raises(Sql92Error, match="nested deeper"):
        compile_sql92("NOT " * (MAX_DEPTH + 1) + "a = 1")
    assert compile_sql92("(" * 10 + "a = 5" + ")" * 10)(PROPS)


def test_keywords_case_insensitive_and_quotes_escape():
    assert compile_sql92("b in ('abc') and not a is null")(PROPS)
    assert compile_sql92("q = 'it''s'")({"q": "it's"})
    assert [t[0] for t in tokenize("x<>'y'")] == ["id", "op", "str", "end"]


def test_build_dispatches_types():
    codes, pred = build(None, "TagA || TagB")
    assert pred is None and codes is not None and len(codes) == 2
    assert build("TAG", "*") == (None, None)
    codes, pred = build("sql92", "a > 1")
    assert codes is None and pred({"a": "2"})
    with pytest.raises(FilterError, match="bad SQL92 expression"):
        build("SQL92", "a >")
    with pytest.raises(FilterError, match="unsupported filter expression type"):
        build("CLASS", "x")


def test_sql92_disabled_refuses_sql92_only():
    for expr in ("a > 1", "a >"):  # refused whether or not it parses
        with pytest.raises(FilterDisabled, match="does not support .* SQL92"):
            build("SQL92", expr, sql92_enabled=False)
    assert build("TAG", "*", sql92_enabled=False) == (None, None)


def test_keep_matching_filters_raw_records():
    from tidemq.node.store.message import StoreMessage
    from tidemq.protocol import record as rec

    def raw(props):
        m = StoreMessage("T", 0, b"x", props)
        buf = bytearray(m.size_no_crc)
        rec.encode_into(buf, 0, m.topic_bytes, 0, 0, 0, 0, 0, 0, m.born_host, 0, m.store_host,
                        0, 0, m.body, m.properties_raw, with_crc=False)
        return bytes(buf)
    records = [raw({"a": "1"}), raw({"a": "7"}), b"garbage-record"]
    kept = keep_matching(records, compile_sql92("a > 5"))
    assert kept == records[1:]


_ops = st.sampled_from(["=", "<>", ">", ">=", "<", "<="])


@settings(max_examples=300, deadline=None)
@given(st.integers(-1000, 1000), _ops, st.integers(-1000, 1000))
def test_numeric_comparison_matches_python(value, op, literal):
    pyop = {"=": "==", "<>": "!="}.get(op, op)
    expected = eval(f"{value} {pyop} {literal}")
    assert compile_sql92(f"x {op} {literal}")({"x": str(value)}) is expected


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_text_parses_or_raises_sql92_error(text):
    """No input escapes as anything but Sql92Error; a compiled predicate returns a bool."""
    try:
        pred = compile_sql92(text)
    except Sql92Error:
        return
    assert pred(PROPS) in (True, False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=6), st.booleans())
def test_and_or_match_python(values, use_and):
    joiner = " AND " if use_and else " OR "
    expr = joiner.join("TRUE" if v else "FALSE" for v in values)
    assert compile_sql92(expr)({}) is (all(values) if use_and else any(values))
