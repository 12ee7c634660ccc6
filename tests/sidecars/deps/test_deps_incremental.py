"""The incremental audit's shortcuts (issue 21) never hide a change: directory listings reused
by (inode, mtime_ns, ctime_ns), whole distributions judged by one fingerprint of their files'
stat identities, RECORDs parsed only when used, the compact cache format."""

from __future__ import annotations

import json
import os

import pytest

from sidecars.deps.cache import CACHE_VERSION, IntegrityCache
from sidecars.deps.installed import LazyRecord, parse_record, scan_distributions
from sidecars.deps.walk import batches_of, read_small, walk_tree
from tests.sidecars.deps.deps_helpers import kinds
from tests.sidecars.deps.test_deps_attacks import ATTACKS, _run
from warden.safeio import UnsafeFile, read_regular

FUTURE = -(10**12)  # RACY_NS: a horizon in the future, so every listing of a fresh test tree is kept


@pytest.fixture
def listings_kept(monkeypatch):
    """The tests' trees are seconds old: without this, no listing would be reused (walk.RACY_NS)."""
    monkeypatch.setattr("sidecars.deps.walk.RACY_NS", FUTURE)


def _tree(tmp_path):
    root = tmp_path / "root"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("a\n")
    (root / "pkg" / "sub" / "b.py").write_text("b\n")
    return root


def test_a_reused_listing_still_sees_every_change(tmp_path, listings_kept):
    root = _tree(tmp_path)
    listings: dict = {}
    first = walk_tree(str(root), listings=listings)
    assert first.relisted == 3 and set(listings) == {str(root), str(root / "pkg"), str(root / "pkg" / "sub")}
    again = walk_tree(str(root), listings=listings)
    assert again.relisted == 0 and set(again.files) == set(first.files)
    sub = root / "pkg" / "sub"
    before = os.stat(sub)
    (sub / "new.py").write_text("planted\n")
    os.utime(sub, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime put back: ctime still moved
    changed = walk_tree(str(root), listings=listings)
    assert str(sub / "new.py") in changed.files and changed.relisted == 1
    (root / "pkg" / "a.py").write_text("edited\n")  # content: the file's own stat, taken every walk
    assert walk_tree(str(root), listings=listings).files[str(root / "pkg" / "a.py")].st_size == 7
    (root / "pkg" / "a.py").unlink()
    os.mkdir(root / "pkg" / "a.py")  # a file replaced by a directory is descended
    (root / "pkg" / "a.py" / "inner.py").write_text("x\n")
    assert str(root / "pkg" / "a.py" / "inner.py") in walk_tree(str(root), listings=listings).files


def test_a_listing_of_a_recently_changed_directory_is_not_kept(tmp_path):
    """Timestamps are coarse: a directory changed within RACY_NS of the walk is listed again next time."""
    root = _tree(tmp_path)
    listings: dict = {}
    walk_tree(str(root), listings=listings)
    assert listings == {}
    assert walk_tree(str(root), listings=listings).relisted == 3


# the attacks that add, replace or remove directory entries, run with every listing reused
ENTRY_ATTACKS = [
    "unowned_bin_script",
    "fifo_pth",
    "editable_pth_with_import",
    "dist_added_with_matching_record",
    "unowned_link_leaving_tree",
    "approved_dist_removed",
    "pyc_replaced_by_link",
    "owned_file_becomes_link_outside",
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ENTRY_ATTACKS)
def test_attacks_are_caught_with_reused_listings_and_remembered_dists(name, test_env, tmp_path, listings_kept):
    approved = test_env.audit(approve=True)
    assert approved.exit_code == 0, approved.findings
    warm = test_env.audit()  # listings and clean distributions from the cache
    stats = warm.stats["integrity"]
    assert warm.exit_code == 0 and stats["files_hashed"] == 0
    assert stats["dirs_listed"] == 0 and stats["dirs_walked"] > 100 and stats["dists_cached"] == 4
    expected = _run(ATTACKS[name], test_env, tmp_path)
    report = test_env.audit()
    assert expected in kinds(report, "integrity"), sorted(kinds(report))
    assert report.exit_code == 1


def test_an_unchanged_distribution_is_not_parsed_and_a_changed_one_is_judged_again(test_env, listings_kept):
    assert test_env.audit(approve=True).exit_code == 0
    cache = IntegrityCache.for_target(str(test_env.state_dir), (str(test_env.site),)).load()
    known = cache.known_records()
    assert len(known) == 4  # pip, setuptools, six, idna were remembered clean
    dists = scan_distributions(str(test_env.site), known)
    assert all(isinstance(d.record, LazyRecord) and d.record._rows is None for d in dists)
    six = next(d for d in dists if d.canonical == "six")
    assert tuple(six.record) == parse_record((test_env.site / "six-1.16.0.dist-info" / "RECORD").read_bytes())
    core = test_env.site / "idna" / "core.py"
    st = os.stat(core)
    data = core.read_bytes()
    core.write_bytes(data[:-2] + b"#\n")  # same size, mtime put back: only ctime tells
    os.utime(core, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = test_env.audit()
    assert ("tampered", str(core)) in kinds(report, "integrity")
    assert report.stats["integrity"]["files_hashed"] == 1


def test_full_pass_does_not_trust_remembered_distributions(test_env):
    assert test_env.audit(approve=True).exit_code == 0
    report = test_env.audit(full_pass=True)
    assert report.stats["integrity"]["files_cached"] == 0 and report.stats["integrity"]["files_hashed"] > 500


def test_cache_of_another_version_or_shape_costs_a_full_pass(tmp_path):
    path = tmp_path / "cache.json"
    path.write_text(json.dumps({"version": CACHE_VERSION, "files": {"/x": [1, 2, 3, 4, "sha256=x"]}, "pyc": {}}))
    cache = IntegrityCache(str(path)).load()
    assert cache.digest("/x", (1, 2, 3, 4), "sha256") is None  # an entry of another shape is never trusted
    path.write_text(json.dumps({"version": CACHE_VERSION - 1, "files": {"/x": "1 2 3 4 sha256=x"}}))
    assert IntegrityCache(str(path)).load().files == {}
    path.write_text(json.dumps({"version": CACHE_VERSION, "files": {"/x": "1 2 3 4 sha256=x"}}))
    cache = IntegrityCache(str(path)).load()
    assert cache.digest("/x", (1, 2, 3, 4), "sha256") == "sha256=x"
    assert cache.digest("/x", (1, 2, 3, 5), "sha256") is None  # ctime differs


def test_batches_keep_order_and_close_on_count_or_weight():
    assert batches_of([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert batches_of([10, 1, 1, 1, 1], 3, weight=lambda x: x, limit=10) == [[10], [1, 1, 1], [1]]
    assert batches_of([], 4) == []


@pytest.mark.timeout(60)
def test_capped_reads_take_whole_small_files_and_refuse_the_rest(tmp_path):
    small = tmp_path / "a.pyc"
    small.write_bytes(b"x" * 5000)
    assert read_regular(str(small), 5000) == b"x" * 5000
    assert read_small(str(small), 100) == b"x" * 100
    with pytest.raises(UnsafeFile, match="over the 4999-byte cap"):
        read_regular(str(small), 4999)
    link = tmp_path / "link.pyc"
    link.symlink_to(small)
    fifo = tmp_path / "fifo.pyc"
    os.mkfifo(fifo)
    for path in (link, fifo):
        with pytest.raises(UnsafeFile):
            read_regular(str(path), 10**6)


def test_site_packages_digests_are_read_only_when_needed(tmp_path):
    site = str(tmp_path / "site")
    path = str(tmp_path / "cache.json")
    cache = IntegrityCache(path, (site,)).load()
    cache.put_digest(f"{site}/a.py", (1, 2, 3, 4), "sha256=A")
    cache.put_digest("/usr/lib/x.py", (1, 2, 3, 4), "sha256=B")
    cache.save()
    again = IntegrityCache(path, (site,)).load()
    assert again.digest("/usr/lib/x.py", (1, 2, 3, 4), "sha256") == "sha256=B"
    assert again._site is None  # the side file is not read for a path outside site-packages
    assert again.digest(f"{site}/a.py", (1, 2, 3, 4), "sha256") == "sha256=A"
    (tmp_path / "cache.json").write_text("{")  # a main file that cannot be read: its side file is not used
    assert IntegrityCache(path, (site,)).load().digest(f"{site}/a.py", (1, 2, 3, 4), "sha256") is None
