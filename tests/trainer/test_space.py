"""trainer/space.py: the save plan's invariants (generated), the errno behind a failed write, and
free space and checkpoint sizes measured on a real size-limited tmpfs (the small_fs fixture)."""

from __future__ import annotations

import errno
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer import space
from warden import safeio
from warden.errors import IncompleteError

EXAMPLES = settings(max_examples=int(os.environ.get("WARDEN_HYPOTHESIS_EXAMPLES", 50)), deadline=None)
GIB = 1 << 30
PAGE = os.sysconf("SC_PAGE_SIZE")
ROOT = "/ckpt/run-1"


# -- plan_save: generated invariants ------------------------------------------------------------------
checkpoint_sets = st.dictionaries(st.integers(0, 10**6), st.integers(0, 1 << 40), max_size=8).flatmap(
    lambda d: st.permutations(sorted(d.items()))  # any order: plan_save must sort them itself
)
sizes = st.integers(0, 1 << 42)


def plan(checkpoints, *, free, needed, margin=0, keep_last=2, mode="prune_first"):
    return space.plan_save(
        root=ROOT,
        free=free,
        needed=needed,
        checkpoints=list(checkpoints),
        keep_last=keep_last,
        mode=mode,
        margin=margin,
    )


@EXAMPLES
@given(
    checkpoints=checkpoint_sets,
    free=sizes,
    needed=sizes,
    margin=st.integers(0, 1 << 32),
    keep_last=st.integers(1, 6),
    mode=st.sampled_from(space.MODES),
)
def test_plan_invariants(checkpoints, free, needed, margin, keep_last, mode):
    p = plan(checkpoints, free=free, needed=needed, margin=margin, keep_last=keep_last, mode=mode)
    required, by_step = needed + margin, dict(checkpoints)
    oldest_first = sorted(by_step)
    assert (p.free_bytes, p.needed_bytes) == (free, needed)
    assert (p.action == "write") == (free >= required)  # whatever the mode, a save that fits is written
    assert p.freed_bytes == sum(by_step[s] for s in p.prune_steps)
    if p.action in ("write", "prune_then_write"):
        assert free + p.freed_bytes >= required
    if p.action != "prune_then_write":
        assert p.prune_steps == () and p.freed_bytes == 0
    else:
        assert mode == "prune_first" and p.prune_steps
        assert oldest_first[-1] not in p.prune_steps  # the newest existing checkpoint survives
        assert p.prune_steps == tuple(oldest_first[: len(p.prune_steps)])  # oldest first, no gaps
        assert free + p.freed_bytes - by_step[p.prune_steps[-1]] < required  # one fewer would not fit
    if mode == "fail":
        assert p.action in ("write", "fail")
    if mode == "skip":
        assert p.action in ("write", "skip")
    if mode == "prune_first" and p.action == "skip":
        assert free + sum(by_step[s] for s in oldest_first[:-1]) < required  # not even the most pruning fits
    assert "\n" not in p.reason and ROOT in p.reason and " GiB" in p.reason


@EXAMPLES
@given(checkpoints=checkpoint_sets, free=sizes, needed=sizes, keep_last=st.integers(1, 6))
def test_plan_reason_counts_what_retention_would_have_kept(checkpoints, free, needed, keep_last):
    p = plan(checkpoints, free=free, needed=needed, keep_last=keep_last)
    if p.action != "prune_then_write":
        return
    doomed_anyway = len(checkpoints) - (keep_last - 1)
    beyond = max(0, len(p.prune_steps) - max(0, doomed_anyway))
    assert f"{beyond} of them keep_last {keep_last} would have kept" in p.reason
    assert ("on_no_space" in p.reason) == (beyond > 0)  # a remedy only when more than retention went


# -- plan_save: hand cases ----------------------------------------------------------------------------
def test_the_issue_case_prunes_the_checkpoint_retention_would_remove_anyway():
    """32 GB checkpoints, keep_last 2, a disk of 80 GiB holding two: the oldest goes before the write."""
    p = plan([(20, 32 * GIB), (10, 32 * GIB)], free=16 * GIB, needed=32 * GIB, margin=GIB // 2)
    assert (p.action, p.prune_steps, p.freed_bytes) == ("prune_then_write", (10,), 32 * GIB)
    assert "0 of them keep_last 2 would have kept" in p.reason
    assert "32.50 GiB (32.00 GiB + 0.50 GiB margin), 16.00 GiB free" in p.reason


def test_pruning_past_retention_keeps_the_newest_and_says_so():
    p = plan([(10, 5), (20, 5), (30, 5)], free=0, needed=10, keep_last=3)
    assert (p.action, p.prune_steps) == ("prune_then_write", (10, 20))
    assert "1 of them keep_last 3 would have kept" in p.reason
    assert "lower checkpoint.keep_last" in p.reason and "on_no_space to skip or fail" in p.reason


def test_the_only_checkpoint_is_never_pruned_to_make_room():
    p = plan([(10, 100)], free=0, needed=50)
    assert (p.action, p.prune_steps) == ("skip", ())
    assert "no older checkpoint to prune" in p.reason


def test_prune_first_skips_without_pruning_when_pruning_cannot_make_room():
    p = plan([(10, 1), (20, 1), (30, 1)], free=0, needed=10)
    assert (p.action, p.prune_steps, p.freed_bytes) == ("skip", (), 0)
    assert "pruning all 2 checkpoint(s) but the newest would free only" in p.reason


def test_a_save_that_fits_exactly_is_written():
    assert plan([], free=100, needed=90, margin=10).action == "write"
    assert plan([], free=99, needed=90, margin=10).action == "skip"


@pytest.mark.parametrize(
    ("mode", "action", "advice"),
    [("skip", "skip", "prune_first or fail"), ("fail", "fail", "prune_first or skip")],
)
def test_skip_and_fail_prune_nothing_and_say_what_to_do(mode, action, advice):
    p = plan([(10, GIB), (20, GIB)], free=0, needed=GIB, mode=mode)
    assert (p.action, p.prune_steps) == (action, ())
    assert f"checkpoint.on_no_space is {mode}" in p.reason
    assert "free space" in p.reason and "lower checkpoint.keep_last" in p.reason and advice in p.reason


@pytest.mark.parametrize(
    "bad",
    [
        {"mode": "prune"},
        {"keep_last": 0},
        {"checkpoints": [(1, 1), (1, 2)]},
        {"checkpoints": [(1, -1)]},
        {"margin": -1},
    ],
)
def test_plan_refuses_bad_inputs(bad):
    args = {"checkpoints": [(1, 1)], "free": 0, "needed": 10, **bad}
    with pytest.raises(ValueError):
        plan(args.pop("checkpoints"), **args)


def test_small_sizes_show_their_bytes():
    assert space.gib(32 * GIB) == "32.00 GiB"
    assert space.gib(4096) == "0.00 GiB (4096 bytes)"
    assert space.gib(0) == "0.00 GiB"


# -- sizes of the state ---------------------------------------------------------------------------------
def test_state_bytes_and_the_estimate():
    import torch

    class Counted:  # no nbytes: numel x element_size
        def numel(self):
            return 10

        def element_size(self):
            return 2

    tensors = [torch.zeros(3, 4), torch.zeros(10, dtype=torch.bfloat16), Counted()]
    assert space.state_bytes(tensors) == 48 + 20 + 20
    with pytest.raises(TypeError, match="object"):
        space.state_bytes([object()])
    assert space.estimate_needed(None, 1000) == 1000 + space.NEEDED_SLACK_BYTES
    assert space.estimate_needed(5000, 1000) == 5000  # measured beats counted, and holds the non-tensor files
    with pytest.raises(ValueError):
        space.estimate_needed(-1, 0)


# -- describe_write_failure ----------------------------------------------------------------------------
class SafetensorError(Exception):
    """Like safetensors' Rust error: not an OSError, the errno only in its text."""


HINT_WORDS = {
    errno.ENOSPC: "keep_last",
    errno.EDQUOT: "quota",
    errno.EIO: "warden_path_",
    errno.ESTALE: "warden_path_",
    errno.ENOTCONN: "warden_path_",
    errno.ENOENT: "warden_path_",
    errno.EROFS: "read-only",
    errno.EACCES: "permissions",
}
no_errno_text = st.text(st.characters(blacklist_characters="("), max_size=40)  # never "(os error N)" itself
wrappers = st.lists(st.tuples(st.sampled_from(["cause", "context"]), no_errno_text), max_size=5)


def wrap(bottom: BaseException, layers) -> BaseException:
    """``bottom`` wrapped in IncompleteErrors as ``raise ... from`` (cause) or ``raise`` in ``except`` (context)."""
    exc = bottom
    for how, text in layers:
        outer = IncompleteError(f"checkpoint write failed: {text}")
        setattr(outer, f"__{how}__", exc)
        exc = outer
    return exc


@EXAMPLES
@given(number=st.sampled_from(sorted(HINT_WORDS)), layers=wrappers, as_text=st.booleans(), free=st.none() | sizes)
def test_describe_write_failure_finds_the_errno_in_any_chain(number, layers, as_text, free):
    if as_text:
        bottom: BaseException = SafetensorError(
            f"Error while serializing: IoError({os.strerror(number)} (os error {number}))"
        )
    else:
        bottom = OSError(number, os.strerror(number), "/ckpt/.tmp-step-000000010.abc/actor.safetensors")
    path = "/ckpt/.tmp-step-000000010"
    reason, name = space.describe_write_failure(wrap(bottom, layers), path=path, needed=3 * GIB, free=free)
    assert name == errno.errorcode[number]
    assert reason.startswith(f"{path}: checkpoint not saved: {os.strerror(number)} ({name})")
    assert HINT_WORDS[number] in reason and "needs 3.00 GiB" in reason
    assert ("free space unknown" in reason) == (free is None)
    assert "\n" not in reason and "\r" not in reason


def test_a_real_oserror_wins_over_errno_text_above_it():
    exc = wrap(OSError(errno.ENOSPC, "No space left on device"), [("cause", "SafetensorError (os error 5)")])
    assert space.find_errno(exc)[0] == errno.ENOSPC


def test_exception_groups_and_loops_are_followed():
    group = ExceptionGroup("writes failed", [ValueError("x"), OSError(errno.EIO, "Input/output error")])
    assert space.describe_write_failure(wrap(group, [("cause", "")]), path="/p", needed=0, free=0)[1] == "EIO"
    a, b = IncompleteError("a"), IncompleteError("b")
    a.__context__, b.__context__ = b, a
    reason, name = space.describe_write_failure(a, path="/p", needed=0, free=0)
    assert name is None and "IncompleteError: a" in reason


def test_without_an_errno_the_exception_text_is_shown_sanitised():
    reason, name = space.describe_write_failure(RuntimeError("bad\nline\x1b[2J"), path="/p", needed=0, free=GIB)
    assert name is None
    assert "RuntimeError: bad line\\x1b[2J" in reason and "1.00 GiB free" in reason


# -- on a real small filesystem --------------------------------------------------------------------------
def test_free_bytes_of_a_small_fs_and_of_a_root_not_made_yet(small_fs):
    root = small_fs(4 << 20)
    assert 4 << 20 >= space.free_bytes(root) >= (4 << 20) - 16 * PAGE
    # a root make_root has not created yet is measured at its nearest parent: this tmpfs, not tmp_path's
    assert space.free_bytes(os.path.join(root, "run", "checkpoints")) == space.free_bytes(root)


def test_free_bytes_names_the_root_it_cannot_measure(tmp_path):
    (tmp_path / "file").write_text("x")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    for root, why in ((tmp_path / "file" / "ckpt", "ENOTDIR"), (tmp_path / "dangling" / "ckpt", "ENOENT")):
        with pytest.raises(space.SpaceError, match=why) as caught:
            space.free_bytes(str(root))
        assert str(root) in str(caught.value) and isinstance(caught.value.__cause__, OSError)


def test_a_write_past_the_small_fs_is_enospc_and_described_as_such(small_fs):
    root = small_fs(1 << 20)
    target = os.path.join(root, ".tmp-step-000000010")
    os.mkdir(target)
    fd = os.open(os.path.join(target, "actor.safetensors"), safeio.WRITE_FLAGS, 0o644)
    try:
        with pytest.raises(OSError) as caught:
            safeio.write_all(fd, bytes(2 << 20))
    finally:
        os.close(fd)
    assert caught.value.errno == errno.ENOSPC
    free = space.free_bytes(root)
    assert free < PAGE  # the write filled it
    try:
        raise IncompleteError(f"{target}: checkpoint write failed: {caught.value.strerror}") from caught.value
    except IncompleteError as wrapped:
        reason, name = space.describe_write_failure(wrapped, path=target, needed=2 << 20, free=free)
    assert name == "ENOSPC"
    assert reason.startswith(f"{target}: checkpoint not saved: No space left on device (ENOSPC)")
    assert f"needs 0.00 GiB (2097152 bytes), {space.gib(free)} free" in reason and "keep_last" in reason


def make_checkpoint(root: str, step: int, sizes: list[int]) -> str:
    path = os.path.join(root, f"step-{step:09d}")
    os.makedirs(os.path.join(path, "actor"))
    for i, size in enumerate(sizes):
        with open(os.path.join(path, "actor" if i % 2 else "", f"f{i}.bin"), "wb") as fh:
            fh.write(os.urandom(size))
    return path


def test_tree_bytes_is_what_removing_the_checkpoint_frees(small_fs, tmp_path):
    root = small_fs(8 << 20)
    empty = space.free_bytes(root)
    outside = tmp_path / "big"
    outside.write_bytes(bytes(1 << 20))
    path = make_checkpoint(root, 10, [0, 1, PAGE, PAGE + 1, 300_000])
    os.symlink(outside, os.path.join(path, "link"))  # counted as a link, never followed
    os.mkfifo(os.path.join(path, "actor", "fifo"))  # counted, never opened (no hang)
    size = space.tree_bytes(path)
    assert size >= sum(-(-n // PAGE) * PAGE for n in (1, PAGE, PAGE + 1, 300_000))
    assert size < 1 << 20  # the link's 1 MiB target is not in it
    assert empty - space.free_bytes(root) == size
    root_fd = safeio.open_root(root)
    try:
        safeio.remove_tree_at(root_fd, os.path.basename(path))
    finally:
        os.close(root_fd)
    assert space.free_bytes(root) == empty


def test_tree_bytes_refuses_a_link_deep_or_huge_trees(tmp_path):
    real = make_checkpoint(str(tmp_path), 10, [10, 10, 10])
    os.symlink(real, tmp_path / "step-000000020")
    with pytest.raises(space.SpaceError, match="step-000000020"):
        space.tree_bytes(str(tmp_path / "step-000000020"))
    with pytest.raises(space.SpaceError, match="more than 3 entries") as caught:
        space.tree_bytes(real, max_entries=3)
    assert isinstance(caught.value.__cause__, safeio.TreeTooLarge)
    os.makedirs(os.path.join(real, "a", "b", "c"))
    with pytest.raises(space.SpaceError, match="deeper than 3 levels"):
        space.tree_bytes(real, max_depth=3)
    assert space.tree_bytes(real, max_depth=4) > 0


def test_a_plan_carried_out_on_a_small_fs_makes_room(small_fs):
    """Three 1 MiB checkpoints on 4 MiB, keep_last 3, a 1.5 MiB save: one pruned, then the write fits."""
    root = small_fs(4 << 20)
    paths = {step: make_checkpoint(root, step, [1 << 20]) for step in (10, 20, 30)}
    checkpoints = [(step, space.tree_bytes(path)) for step, path in paths.items()]
    needed = (3 << 19) + PAGE
    p = plan(checkpoints, free=space.free_bytes(root), needed=needed, margin=PAGE, keep_last=3)
    assert (p.action, p.prune_steps) == ("prune_then_write", (10,))
    root_fd = safeio.open_root(root)
    try:
        for step in p.prune_steps:
            safeio.remove_tree_at(root_fd, os.path.basename(paths[step]))
        assert space.free_bytes(root) == p.free_bytes + p.freed_bytes >= needed + PAGE
        safeio.write_new_at(root_fd, "next.bin", bytes(needed))
    finally:
        os.close(root_fd)
