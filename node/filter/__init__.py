"""Subscription filters the broker evaluates: TAG expressions (by tag hash code, in the store's
consume-queue scan) and SQL92 expressions (on each record's properties, after the read).

Rules:
1. `build(expression_type, expression)` gives (tag_codes, predicate): tag_codes for the store
   (None = every tag), predicate over a properties dict or None. Types are case-insensitive;
   absent or empty means TAG. Any other type, or a bad SQL92 expression, raises FilterError
   with a message fit for the client. With `sql92_enabled` false (the broker's
   enable_property_filter) a SQL92 type raises FilterDisabled, RocketMQ's "does not support"
   refusal, whether or not the expression parses.
2. `keep_matching(records, predicate)` keeps the raw records whose properties satisfy it; a
   record that does not decode is kept (the client sees it, as it would without a filter).
"""
from __future__ import annotations

from tidemq.node.filter.sql92 import Sql92Error, compile_sql92
from tidemq.protocol import record as rec

TAG = "TAG"
SQL92 = "SQL92"


class FilterError(ValueError):
    """A subscription the broker cannot evaluate."""


class FilterDisabled(FilterError):
    """A filter type this broker is configured not to evaluate."""


def build(expression_type: str | None, expression: str | None, *, sql92_enabled: bool = True):
    kind = (expression_type or TAG).upper()
    if kind == TAG:
        from tidemq.node.processors.common import (
            tag_codes,  # the TAG parser lives with the processors
        )
        return tag_codes(expression), None
    if kind == SQL92:
        if not sql92_enabled:
            raise FilterDisabled(f"The broker does not support consumer to filter message by {SQL92}")
        try:
            return None, compile_sql92(expression or "")
        except Sql92Error as exc:
            raise FilterError(f"bad SQL92 expression: {exc}") from None
    raise FilterError(f"unsupported filter expression type {expression_type!r}: use TAG or SQL92")


def record_properties(data: bytes) -> dict[str, str] | None:
    try:
        return rec.decode_record(data).properties
    except rec.RecordError:
        return None


def keep_matching(records, predicate) -> list:
    out = []
    for data in records:
        props = record_properties(data)
        if props is None or predicate(props):
            out.append(data)
    return out
