"""Remote address patterns, as RocketMQ ACL writes them, plus CIDR.

Forms (one pattern, or several separated by commas):
    *                 every address
    192.168.1.7       one address (IPv4 or IPv6)
    192.168.1.*       a wildcard in any dotted IPv4 segment
    192.168.1.10-20   a range in any dotted IPv4 segment
    192.168.1.{7,9}   a set in the last segment
    10.0.0.0/8        a CIDR network (IPv4 or IPv6)
A pattern that fits none of these is an AddressPatternError naming it.
"""
from __future__ import annotations

import ipaddress


class AddressPatternError(ValueError):
    pass


def _segment_matcher(seg: str, pattern: str):
    if seg == "*":
        return lambda n: True
    if "-" in seg:
        lo, _, hi = seg.partition("-")
        if lo.isdigit() and hi.isdigit() and int(lo) <= int(hi) <= 255:
            a, b = int(lo), int(hi)
            return lambda n: a <= n <= b
    elif seg.startswith("{") and seg.endswith("}"):
        items = seg[1:-1].split(",")
        if items and all(i.strip().isdigit() and int(i) <= 255 for i in items):
            allowed = frozenset(int(i) for i in items)
            return allowed.__contains__
    elif seg.isdigit() and int(seg) <= 255:
        v = int(seg)
        return lambda n: n == v
    raise AddressPatternError(f"bad address pattern {pattern!r}")


class AddressSet:
    """Matches an IP address text against a list of patterns; empty matches nothing."""

    def __init__(self, text: str | list):
        self.text = text if isinstance(text, str) else ",".join(text)
        self.any = False
        self._networks = []
        self._dotted = []
        for raw in _split(self.text):
            if raw == "*":
                self.any = True
            elif "/" in raw:
                try:
                    self._networks.append(ipaddress.ip_network(raw, strict=False))
                except ValueError:
                    raise AddressPatternError(f"bad address pattern {raw!r}") from None
            else:
                try:
                    self._networks.append(ipaddress.ip_network(raw))  # one exact address
                    continue
                except ValueError:
                    pass
                segs = raw.split(".")
                if len(segs) != 4:
                    raise AddressPatternError(f"bad address pattern {raw!r}")
                self._dotted.append([_segment_matcher(s, raw) for s in segs])

    def __bool__(self) -> bool:
        return self.any or bool(self._networks) or bool(self._dotted)

    def matches(self, ip: str) -> bool:
        if self.any:
            return True
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        if addr.version == 6 and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if any(addr in net for net in self._networks):
            return True
        if addr.version == 4 and self._dotted:
            parts = [int(p) for p in str(addr).split(".")]
            return any(all(m(p) for m, p in zip(matchers, parts)) for matchers in self._dotted)
        return False


def _split(text: str) -> list[str]:
    """Commas separate patterns, except inside {...}."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return [p for p in out if p]
