"""The HF callback's reading of HF's checkpoint rotation, against transformers' own rotate_checkpoints.

For generated sets of checkpoint steps, save limits and best-model checkpoints, the real
``transformers.trainer_utils.rotate_checkpoints`` deletes directories; ``rotation_removed`` must
name exactly those steps, so the callback announces ``checkpoint.pruned`` for what the library's
rule removed and for nothing else.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

from transformers.trainer_utils import rotate_checkpoints

from trainer.integrations.hf import hf_checkpoint_steps, rotation_removed


@settings(max_examples=int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", "60")), deadline=None)
@given(
    steps=st.sets(st.integers(min_value=1, max_value=400), min_size=1, max_size=12),
    limit=st.one_of(st.none(), st.integers(min_value=-1, max_value=6)),
    best_index=st.one_of(st.none(), st.integers(min_value=0, max_value=11)),
)
def test_rotation_removed_is_what_transformers_removes(steps, limit, best_index):
    ordered = sorted(steps)
    best = ordered[best_index] if best_index is not None and best_index < len(ordered) else None
    with tempfile.TemporaryDirectory() as root:
        for step in ordered:
            os.mkdir(os.path.join(root, f"checkpoint-{step}"))
        best_path = os.path.join(root, f"checkpoint-{best}") if best is not None else None
        rotate_checkpoints(root, save_total_limit=limit, best_model_checkpoint=best_path)
        removed = set(ordered) - hf_checkpoint_steps(root)
    assert rotation_removed(ordered, limit, best) == removed


def test_a_link_named_like_a_checkpoint_is_not_one(tmp_path):
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-7").symlink_to(tmp_path / "checkpoint-5")
    (tmp_path / "checkpoint-x").mkdir()
    assert hf_checkpoint_steps(str(tmp_path)) == {5}
