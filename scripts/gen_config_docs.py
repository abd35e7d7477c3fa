"""Regenerate the key table of docs/configuration.md from the broker's own config description.

    python scripts/gen_config_docs.py          rewrite the table in place
    python scripts/gen_config_docs.py --check  exit 1 if the page is stale (tests run this)

The table sits between two marker lines; everything else on the page is hand-written.
"""
from __future__ import annotations

import pathlib
import sys

from tidemq.node.config import describe

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED: tidemq broker --describe-config -->"
END = "<!-- END GENERATED -->"


def render(page: str) -> str:
    head, _, rest = page.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{describe()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    page = PAGE.read_text(encoding="utf-8")
    if BEGIN not in page or END not in page:
        print(f"{PAGE}: marker lines missing", file=sys.stderr)
        return 1
    fresh = render(page)
    if "--check" in argv:
        if fresh != page:
            print(f"{PAGE} is stale: run python scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
