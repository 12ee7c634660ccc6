"""Issue 33: benign family templates mutated with content-dependent logic of every construct
Jinja offers (tests/warden/tokenscan/mutations.py) are caught by a chat-template finding; the
detection rate per construct is printed (``-s``) and, with ``WARDEN_MUTATION_REPORT=PATH``,
written as Markdown. CI scans a seeded sample; ``WARDEN_MUTATIONS=full`` scans every mutant
(also ``python -m tests.warden.tokenscan.mutations --report PATH``). The unmutated families
scan clean (tests/warden/tokenscan/test_tokenscan_behaviour.py), so a finding is the mutation's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.warden.tokenscan.mutations import CONSTRUCTS, base_templates, measure, mutate, report

FULL = os.environ.get("WARDEN_MUTATIONS") == "full"
SAMPLE = None if FULL else 40


def test_every_construct_is_tried_on_every_family():
    assert len(CONSTRUCTS) >= 18 and len(base_templates()) >= 12
    for family, template in base_templates().items():
        for construct in CONSTRUCTS:
            assert mutate(template, construct) != template, (family, construct)


@pytest.mark.slow
@pytest.mark.timeout(7200 if FULL else 600)
def test_mutated_family_templates_are_caught(tmp_path):
    caught, missed, seconds = measure(tmp_path, SAMPLE)
    text = report(caught, missed, seconds, "full" if FULL else f"seeded sample of {SAMPLE}")
    print("\n" + text)
    if os.environ.get("WARDEN_MUTATION_REPORT"):
        Path(os.environ["WARDEN_MUTATION_REPORT"]).write_text(text + "\n", encoding="utf-8")
    assert sum(len(v) for v in caught.values()) == (len(CONSTRUCTS) * len(base_templates()) if FULL else SAMPLE)
    assert not missed, text
