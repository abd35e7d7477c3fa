"""Java's `String.hashCode()`, bit for bit, for tag codes (heartbeat codeSet, consume queue tag hash).

Definition (java.lang.String): h = s[0]*31^(n-1) + ... + s[n-1] over the string's UTF-16 code
units, in wrapping int32 arithmetic.

Invariants:
1. A character outside the BMP counts as its two surrogate code units, as in Java; a lone
   surrogate (Python allows it, so does Java) counts as itself.
2. The result is a signed int32 (-2**31 .. 2**31-1), what Java prints and stores.
3. Pure and cached: tags repeat on every message, so a bounded LRU makes the common case a dict hit.
"""

import sys
from functools import lru_cache

# Native-order UTF-16 lets memoryview.cast("H") read code units without a byte swap.
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"
_MASK32 = 0xFFFFFFFF
_SIGN32 = 0x80000000


@lru_cache(maxsize=65536)
def java_string_hash(s: str) -> int:
    """Return Java's `s.hashCode()` as a signed int32."""
    units: bytes | memoryview
    if s.isascii():
        units = s.encode("ascii")  # one byte per code unit; iterating bytes yields ints
    else:
        # surrogatepass: a lone surrogate encodes as its own code unit, exactly as Java holds it.
        units = memoryview(s.encode(_UTF16_NATIVE, "surrogatepass")).cast("H")
    h = 0
    for unit in units:
        h = (31 * h + unit) & _MASK32
    return h - (1 << 32) if h & _SIGN32 else h
