"""java_string_hash against values Java prints, and against the UTF-16 definition."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.protocol.jhash import java_string_hash


def utf16_units(s: str) -> list[int]:
    """UTF-16 code units by the definition (surrogate arithmetic), not via Python's codec."""
    units = []
    for ch in s:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    return units


def reference_hash(s: str) -> int:
    """Java's formula with exact integers, wrapped once at the end."""
    units = utf16_units(s)
    h = sum(u * 31 ** (len(units) - 1 - i) for i, u in enumerate(units)) % 2**32
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize("text, expected", [
    ("", 0),
    ("a", 97),
    ("TagA", 2598919),
    ("hello", 99162322),
    ("Aa", 2112),
    ("BB", 2112),  # the classic Java collision
    ("polygenelubricants", -2147483648),  # overflows to Integer.MIN_VALUE
    ("The quick brown fox jumps over the lazy dog", reference_hash("The quick brown fox jumps over the lazy dog")),
    ("\U0001F600", 1772899),  # U+1F600 = \uD83D\uDE00: 0xD83D * 31 + 0xDE00
])
def test_known_java_values(text, expected):
    assert java_string_hash(text) == expected


def test_non_bmp_counts_two_surrogate_units():
    units = utf16_units("\U0001F600")
    assert units == [0xD83D, 0xDE00]
    assert java_string_hash("\U0001F600") == units[0] * 31 + units[1]
    assert java_string_hash("x\U00010348y") == reference_hash("x\U00010348y")
    assert java_string_hash("\U0001F600") != java_string_hash("\uF600")  # not hashed as one code point


def test_long_string_overflows_and_stays_in_int32():
    text = "中文标签" * 500 + "TagA"
    h = java_string_hash(text)
    assert h == reference_hash(text)
    assert -(2**31) <= h < 2**31


def test_lone_surrogate_hashes_as_its_own_code_unit():
    assert java_string_hash("a\ud800") == 97 * 31 + 0xD800


@given(st.text())
def test_matches_the_definition_for_any_text(text):
    assert java_string_hash(text) == reference_hash(text)
