"""The incremental audit's shortcuts (issue 21) never hide a change: directory listings reused
by (inode, mtime_ns, ctime_ns), whole distributions judged by one fingerprint of their files'
stat identities, RECORDs parsed only when used, the compact cache format."""

from __future__ import annotations

import json
import marshal
import os
import shutil
import time

import pytest

from tests.warden.deps.deps_helpers import kinds
from tests.warden.deps.test_deps_attacks import ATTACKS, EVIL, _pyc, _run
from warden.deps import bytecode, filehash, records, stdlib, walk
from warden.deps.cache import CACHE_VERSION, IntegrityCache, key_text
from warden.deps.installed import LazyRecord, RecordEntry, parse_record, scan_distributions
from warden.deps.walk import Changed, batches_of, read_as, read_small, safe_digest, settled, walk_tree
from warden.safeio import UnsafeFile, read_regular, stat_identity

FUTURE = -(10**12)  # RACY_NS: a horizon in the future, so every listing of a fresh test tree is kept


@pytest.fixture
def listings_kept(monkeypatch):
    """The tests' trees are seconds old: without this, no listing would be reused (walk.RACY_NS)."""
    monkeypatch.setattr("warden.deps.walk.RACY_NS", FUTURE)


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


def test_the_inline_row_check_reads_the_entries_put_digest_writes(tmp_path):
    """records._cached_ok builds the cache's entry text inline (once per row): it is the text
    IntegrityCache.put_digest writes under warden.safeio.stat_identity, nothing else."""
    path = tmp_path / "a.py"
    path.write_bytes(b"x")
    st = os.lstat(path)
    cache = IntegrityCache(None)
    cache.put_digest(str(path), stat_identity(st), "sha256=x")
    assert cache.entry(str(path)) == f"{key_text(stat_identity(st))} sha256=x"
    assert records._cached_ok(RecordEntry("a.py", "sha256=x", 1), st, cache.entry(str(path)))
    assert not records._cached_ok(RecordEntry("a.py", "sha256=y", 1), st, cache.entry(str(path)))


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


# ---- a file that changes between the walk and the read (security review: TOCTOU in the caches) ----


def _swapped_in_while(module, name: str, live: str, other, monkeypatch) -> None:
    """While ``module.name`` runs, the directory ``other`` is renamed in at ``live`` (and back after):
    the walk before it saw one tree, the reads in it see another (the same paths, other inodes)."""
    real = getattr(module, name)
    aside = f"{other}.aside"

    def raced(*args, **kwargs):
        os.rename(live, aside)
        os.rename(other, live)
        try:
            return real(*args, **kwargs)
        finally:
            os.rename(live, other)
            os.rename(aside, live)

    monkeypatch.setattr(module, name, raced)


def _same_size_edit(path, payload: bytes) -> None:
    data = path.read_bytes()
    path.write_bytes(payload + data[len(payload) :])


def _changed(report, path: str) -> bool:
    return any(i.startswith("changed: ") and path in i for i in report.incomplete)


@pytest.mark.timeout(300)
def test_a_file_swapped_in_while_hashing_is_not_cached_under_the_walked_stat(test_env, tmp_path, monkeypatch):
    """The walk stats a malicious idna/ (same sizes), a benign idna/ is renamed in while the RECORD rows
    are hashed. Caching the benign digest under the malicious file's stat key (and remembering idna as
    clean) let every later incremental audit pass it. Now the audit says the file changed (exit 3),
    caches nothing for it, and the next audit, the malicious file in place, finds it."""
    site = str(test_env.site)
    assert test_env.audit().exit_code == 0
    evil = tmp_path / "idna_evil"
    shutil.copytree(f"{site}/idna", evil)
    _same_size_edit(evil / "core.py", b"import os; os.system('true')\n")
    benign = tmp_path / "idna_benign"
    os.rename(f"{site}/idna", benign)
    os.rename(evil, f"{site}/idna")  # the malicious tree in place, for the walk
    core = f"{site}/idna/core.py"
    _swapped_in_while(filehash, "hash_all", f"{site}/idna", benign, monkeypatch)
    raced = test_env.audit()
    assert raced.exit_code == 3 and _changed(raced, core), raced.incomplete
    cache = IntegrityCache.for_target(str(test_env.state_dir), (site,)).load()
    assert cache.digest(core, stat_identity(os.lstat(core)), "sha256") is None
    assert not [d for d in cache.dists if os.path.basename(d).startswith("idna-")]
    monkeypatch.undo()
    monkeypatch.setattr(walk, "DIGEST_RACY_NS", -(10**12))
    after = test_env.audit()
    assert ("tampered", core) in kinds(after, "integrity") and after.exit_code == 1


@pytest.mark.timeout(300)
def test_a_pyc_swapped_in_while_checked_keeps_no_verdict_under_the_walked_stat(test_env, tmp_path, monkeypatch):
    """The same race on the .pyc check: the walk stats a pyc with foreign code, the known-good pyc is
    in place while the pairs are read and compiled. Its verdict must not be kept under the foreign
    pyc's stat key: the next audit compiles the foreign pyc and reports it."""
    site = str(test_env.site)
    assert test_env.audit().exit_code == 0
    pyc = _pyc(test_env, "six.py")
    cache_dir = os.path.dirname(pyc)
    evil = tmp_path / "pycache_evil"
    shutil.copytree(cache_dir, evil)
    evil_pyc = evil / os.path.basename(pyc)
    header = evil_pyc.read_bytes()[:16]
    evil_pyc.write_bytes(header + marshal.dumps(compile(EVIL, f"{site}/six.py", "exec")))
    benign = tmp_path / "pycache_benign"
    os.rename(cache_dir, benign)
    os.rename(evil, cache_dir)
    _swapped_in_while(bytecode, "check_pycs", cache_dir, benign, monkeypatch)
    raced = test_env.audit()
    assert raced.exit_code == 3 and _changed(raced, pyc), raced.incomplete
    monkeypatch.undo()
    monkeypatch.setattr(walk, "DIGEST_RACY_NS", -(10**12))
    after = test_env.audit()
    assert ("pyc_mismatch", pyc) in kinds(after, "integrity") and after.exit_code == 1


@pytest.mark.timeout(300)
def test_a_stdlib_file_swapped_in_while_hashing_is_not_cached_under_the_walked_stat(base_env, tmp_path, monkeypatch):
    """The same race on the base interpreter's stdlib (stdlib.py): neither the file's digest nor the
    whole stdlib's state may be kept; the next audit reports the edited module."""
    assert base_env.audit(approve=True).exit_code == 0
    json_dir = str(base_env.stdlib / "json")
    evil = tmp_path / "json_evil"
    shutil.copytree(json_dir, evil, symlinks=True)
    (evil / "decoder.py").write_text((evil / "decoder.py").read_text() + "\nimport os  # planted\n")
    benign = tmp_path / "json_benign"
    os.rename(json_dir, benign)
    os.rename(evil, json_dir)
    decoder = f"{json_dir}/decoder.py"
    _swapped_in_while(stdlib, "_digests", json_dir, benign, monkeypatch)
    raced = base_env.audit()
    assert raced.exit_code == 3 and _changed(raced, decoder), raced.incomplete
    monkeypatch.undo()
    monkeypatch.setattr(walk, "DIGEST_RACY_NS", -(10**12))
    after = base_env.audit()
    assert ("stdlib_changed", decoder) in kinds(after, "integrity") and after.exit_code == 1


def test_digests_are_taken_only_of_the_walked_file(tmp_path):
    """walk.safe_digest / read_as with the walk's stat: a file renamed over (same size), rewritten in
    place (mtime put back), a link replaced by another, or a directory above swapped raises Changed."""
    path = tmp_path / "d" / "a.py"
    path.parent.mkdir()
    path.write_bytes(b"benign\n")
    st = os.lstat(path)
    assert safe_digest(str(path), "sha256", st) == safe_digest(str(path), "sha256")
    assert read_as(str(path), 100, st) == b"benign\n"
    other = tmp_path / "b.py"
    other.write_bytes(b"evil!!\n")
    os.rename(other, path)
    with pytest.raises(Changed):
        safe_digest(str(path), "sha256", st)
    with pytest.raises(Changed):
        read_as(str(path), 100, st)
    st = os.lstat(path)
    path.write_bytes(b"EVIL!!\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # ctime still moved
    with pytest.raises(Changed):
        safe_digest(str(path), "sha256", st)
    link = tmp_path / "d" / "l"
    link.symlink_to("target-a")
    st = os.lstat(link)
    assert safe_digest(str(link), "sha256", st) == safe_digest(str(link), "sha256")
    link.unlink()
    link.symlink_to("target-b")
    with pytest.raises(Changed):
        safe_digest(str(link), "sha256", st)
    st = os.lstat(path)
    twin = tmp_path / "twin"
    shutil.copytree(tmp_path / "d", twin, symlinks=True)
    os.rename(tmp_path / "d", tmp_path / "d.aside")
    os.rename(twin, tmp_path / "d")
    with pytest.raises(Changed):
        safe_digest(str(path), "sha256", st)


def test_settled_needs_a_change_older_than_the_racy_window(tmp_path, monkeypatch):
    path = tmp_path / "a.py"
    path.write_bytes(b"x")
    st = os.lstat(path)
    assert settled(st, time.time_ns())  # the tests' files count as settled (conftest)
    monkeypatch.setattr(walk, "DIGEST_RACY_NS", walk.RACY_NS)
    assert not settled(st, time.time_ns())
    assert not settled(st, st.st_ctime_ns + walk.RACY_NS) and settled(st, st.st_ctime_ns + walk.RACY_NS + 1)


@pytest.mark.timeout(300)
def test_digests_of_files_changed_just_before_the_audit_are_not_cached(test_env, monkeypatch):
    """Timestamps are coarse: a file written in the tick of the read could keep its stat key, so a
    digest is cached only for a file whose ctime is DIGEST_RACY_NS older than the read (the rule
    tokenscan's cache follows). The test venv is seconds old: nothing of it is cached or remembered."""
    monkeypatch.setattr(walk, "DIGEST_RACY_NS", walk.RACY_NS)
    assert test_env.audit().exit_code == 0
    again = test_env.audit()
    stats = again.stats["integrity"]
    assert again.exit_code == 0 and stats["files_hashed"] > 500 and stats["dists_cached"] == 0
    assert stats["pyc_cached"] == 0
    monkeypatch.setattr(walk, "DIGEST_RACY_NS", -(10**12))
    assert test_env.audit().exit_code == 0
    warm = test_env.audit().stats["integrity"]
    assert warm["files_hashed"] == 0 and warm["dists_cached"] == 4 and warm["pyc_checked"] == 0
