"""``python -m warden.diagnose --write-rules FILE``: regenerates the recording rules from the table."""

from __future__ import annotations

import sys

from warden.diagnose.causes import rules_text
from warden.safeio import atomic_write_bytes


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--write-rules":
        print("usage: python -m warden.diagnose --write-rules FILE", file=sys.stderr)
        return 2
    atomic_write_bytes(argv[1], rules_text().encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
