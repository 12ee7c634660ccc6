"""Writes a copy of a policy file with one line replaced (exactly one match, else it fails).

Used at image build time so that the compose stack's policy stays the repository's policy
with the stack's paths filled in, comments and all:
    python stack/derive-policy.py policies/deps.yaml policies/deps.compose.yaml "  osv_db: null" "  osv_db: /x"
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if len(argv) < 4 or len(argv) % 2:
        print("usage: derive-policy.py SRC DST OLD_LINE NEW_LINE [OLD_LINE NEW_LINE ...]", file=sys.stderr)
        return 2
    src, dst, pairs = argv[0], argv[1], argv[2:]
    with open(src, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    for old, new in zip(pairs[0::2], pairs[1::2], strict=True):
        hits = [i for i, line in enumerate(lines) if line.split("#", 1)[0].rstrip() == old]
        if len(hits) != 1:
            print(f"{src}: expected exactly one line {old!r}, found {len(hits)}", file=sys.stderr)
            return 1
        comment = lines[hits[0]][len(old) :].strip()
        lines[hits[0]] = new + (f"  {comment}" if comment.startswith("#") else "")
    with open(dst, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
