"""Header field kinds of the request table: what a field's text may be, and its Python value.

A kind is a small frozen object with `convert(name, text) -> value` that raises RequestError
(1 SYSTEM_ERROR, a remark naming the field and the rule, never the client's text) for text it
does not accept. Header values arrive as strings (JSON numbers and booleans are turned into
text by the frame decoder), so every kind reads a str.

| kind | accepts | value |
|---|---|---|
| Int(32 / 64, min) | optional sign and ASCII digits, within Java's int / long and >= min | int |
| Bool | anything: "true" or "1" (any case) is True, the rest False (Java, cpp) | bool |
| Text(max_chars) | at most max_chars characters | str |
| Name(max_chars) | Java's TopicValidator characters `[%|a-zA-Z0-9_-]`, whole text | str |
| Choice(words) | one of the words | str |

Rule: names are matched whole (re.fullmatch): `$` would accept a final newline.
"""
from __future__ import annotations

from dataclasses import dataclass

from tidemq.node.topics import TOPIC_PATTERN
from tidemq.protocol.codes import ResponseCode

INT32 = (-2**31, 2**31 - 1)
INT64 = (-2**63, 2**63 - 1)
NAME_CHARS = TOPIC_PATTERN  # Java's TopicValidator characters; always fullmatch


class RequestError(ValueError):
    """A request refused before anything ran: `code` is the response code, `remark` the
    client-facing reason (no exception text, no echo of the client's value)."""

    def __init__(self, remark: str, code: int = ResponseCode.SYSTEM_ERROR):
        super().__init__(remark)
        self.code = int(code)
        self.remark = remark


@dataclass(frozen=True)
class Int:
    bits: int = 32
    min: int | None = None

    def bounds(self) -> tuple[int, int]:
        lo, hi = INT32 if self.bits == 32 else INT64
        return (lo if self.min is None else self.min), hi

    def describe(self) -> str:
        lo, hi = self.bounds()
        return f"an integer from {lo} to {hi}"

    def convert(self, name: str, text: str) -> int:
        lo, hi = self.bounds()
        if text.__class__ is str and text.isascii() and len(text) <= 20:
            digits = text[1:] if text[:1] in ("-", "+") else text
            if digits.isdigit():  # ASCII digits only: no "1_0", " 1", or other int() leniencies
                value = int(text)
                if lo <= value <= hi:
                    return value
        raise RequestError(f"header field {name} must be {self.describe()}")


@dataclass(frozen=True)
class Bool:
    def describe(self) -> str:
        return "true or false"

    def convert(self, name: str, text: str) -> bool:
        text = text.lower()
        return text == "true" or text == "1"


@dataclass(frozen=True)
class Text:
    max_chars: int = 1024

    def describe(self) -> str:
        return f"text of at most {self.max_chars} characters"

    def convert(self, name: str, text: str) -> str:
        if len(text) > self.max_chars:
            raise RequestError(f"header field {name} must be {self.describe()}")
        return text


@dataclass(frozen=True)
class Name:
    """A topic or group name. Empty text is refused when the field is required and passes
    as "" (no name) when it is optional."""
    max_chars: int = 255
    allow_empty: bool = False

    def describe(self) -> str:
        return f"a name of 1 to {self.max_chars} characters from A-Z a-z 0-9 % | _ -"

    def convert(self, name: str, text: str) -> str:
        if not text and self.allow_empty:
            return text
        if len(text) > self.max_chars or NAME_CHARS.fullmatch(text) is None:
            raise RequestError(f"header field {name} must be {self.describe()}")
        return text


@dataclass(frozen=True)
class Choice:
    words: tuple[str, ...]

    def describe(self) -> str:
        return "one of " + ", ".join(self.words)

    def convert(self, name: str, text: str) -> str:
        if text not in self.words:
            raise RequestError(f"header field {name} must be {self.describe()}")
        return text
