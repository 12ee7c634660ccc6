"""Issue 33: benign family templates mutated with content-dependent logic of every construct
Jinja offers (tests/warden/tokenscan/mutations.py) are caught by a chat-template finding; the
detection rate per construct is printed (``-s``) and, with ``WARDEN_MUTATION_REPORT=PATH``,
written as Markdown. CI scans a seeded sample; ``WARDEN_MUTATIONS=full`` scans every mutant.
The unmutated families scan clean (tests/warden/tokenscan/test_tokenscan_behaviour.py), so a
finding here is the mutation's."""

from __future__ import annotations

import os
import shutil
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.warden.tokenscan.families import _set_template, build_family
from tests.warden.tokenscan.mutations import CONSTRUCTS, base_templates, mutants, mutate
from warden.tokenscan import scan_directory
from warden.tokenscan.policy import default_policy

FULL = os.environ.get("WARDEN_MUTATIONS") == "full"
SAMPLE = None if FULL else 14
JINJA_FILE = ("gpt-oss",)  # families whose template is chat_template.jinja


def _with_template(base: Path, out: Path, family: str, template: str) -> Path:
    shutil.copytree(base, out)
    if family in JINJA_FILE:
        (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    else:
        _set_template(out, template)
    return out


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bases")
    return {f: build_family(f, root / f) for f in base_templates()}


def test_every_construct_is_tried_on_every_family():
    assert len(CONSTRUCTS) >= 18 and len(base_templates()) >= 12
    for family, template in base_templates().items():
        for construct in CONSTRUCTS:
            assert mutate(template, construct) != template, (family, construct)


@pytest.mark.slow
def test_mutated_family_templates_are_caught(bases, tmp_path):
    policy = default_policy()
    caught: dict[str, list[bool]] = defaultdict(list)
    missed = []
    start = time.perf_counter()
    for n, (family, construct, template) in enumerate(mutants(SAMPLE)):
        d = _with_template(bases[family], tmp_path / f"m{n}", family, template)
        result = scan_directory(str(d), policy)
        hit = any(f.id.startswith("TS8") for f in result.findings)
        caught[construct].append(hit)
        if not hit:
            missed.append((family, construct))
    seconds = time.perf_counter() - start
    total = sum(len(v) for v in caught.values())
    rows = [f"| {c} | {sum(v)}/{len(v)} | {100 * sum(v) / len(v):.0f}% |" for c, v in sorted(caught.items())]
    report = "\n".join(
        [
            f"Template mutations ({'full' if FULL else f'seeded sample of {SAMPLE}'}): "
            f"{sum(sum(v) for v in caught.values())}/{total} caught in {seconds:.1f} s",
            "",
            "| construct | caught | rate |",
            "|---|---|---|",
            *rows,
            "",
            "missed: " + (", ".join(f"{f}/{c}" for f, c in missed) or "none"),
        ]
    )
    print("\n" + report)
    if os.environ.get("WARDEN_MUTATION_REPORT"):
        Path(os.environ["WARDEN_MUTATION_REPORT"]).write_text(report + "\n", encoding="utf-8")
    assert not missed, report
