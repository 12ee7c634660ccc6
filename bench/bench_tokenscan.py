#!/usr/bin/env python3
"""Tokenizer/model scanner benchmark (issue 6): cost, and detection against picklescan and modelscan.

1. Detection: the test corpus (``tests/warden/tokenscan/corpus.py``: a benign tokenizer and
   one malicious variant per check) through ``warden scan`` (library), ``picklescan -p DIR`` and
   ``modelscan -p DIR`` (their CLIs; exit 1 = they flagged something). Prints what each catches.
2. A ``--size-mb`` model directory (tokenizer files + safetensors shards of random data):
   our scan with and without the SHA-256 manifest, against the anchor of plain threaded
   ``hashlib.sha256`` over the same files (page cache warm; best of ``--repeat``).
3. ``--dirs`` tokenizer directories (copies of the benign one, with a chat template): our scan
   in-process (templates identical -> one sandbox render, and all distinct -> one render each),
   the CLI (one process), against the anchor of loading each with ``AutoTokenizer.from_pretrained``
   (what the trainer does anyway); picklescan/modelscan over the same parent folder.

4. Behaviour (issue 18): the attack corpus of ``tests/warden/tokenscan/attacks.py`` (one
   generator per class, 40+ cases) and the benign family fixtures (``families.py``: Llama 3.1,
   Qwen2.5, Gemma, Mistral, Phi-3, BERT, T5) through ours, picklescan, modelscan, modelaudit
   and fickling (``fickling.is_likely_safe`` on every file, in a child process): cases caught
   by class, false positives on the families, seconds.
5. Speed (issue 18): ``--dirs`` tokenizer directories of ``--vocab``-sized byte-level BPE
   tokenizers (``--distinct`` of them, copied round-robin) and a node's ``--dirs`` checkpoints
   sharing one tokenizer (alone, and beside a ``--shard-mb`` weights shard as in a checkpoint),
   scanned cold (fresh caches, sandbox workers stopped) and warm (the sidecar's rescans: a
   manifest, its stat-keyed hash cache, the stored verdicts; and the same rehashing every file)
   with ``scan_paths`` (the CLI's path) against the anchor of hashing their bytes with threaded
   SHA-256 (page cache warm); and the floor: one sandboxed ``tokenizers`` load per distinct
   tokenizer against hashing it.

Not a test: absolute numbers depend on the machine; the ratios are the result.

    .venv/bin/python bench/bench_tokenscan.py [--size-mb 500] [--dirs 50] [--repeat 3] [--vocab 32000]
        [--distinct 5] [--shard-mb 16]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))
from repo_tests import use_repo_tests  # noqa: E402

use_repo_tests(ROOT)

from warden.tokenscan import chat_template as ct  # noqa: E402
from warden.tokenscan import default_policy, scan_directory  # noqa: E402
from warden.tokenscan.manifest import HashCache  # noqa: E402

MIB = 1 << 20
BIN = Path(sys.executable).parent


def load_corpus_module():
    from tests.warden.tokenscan import corpus  # the tests' corpus builders (ROOT is on sys.path)

    return corpus


def tool(name: str) -> str | None:
    path = BIN / name
    return str(path) if path.exists() else shutil.which(name)


def run_tool(cmd: list[str]) -> tuple[int, float]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, timeout=600)
    return proc.returncode, time.perf_counter() - start


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


# -- 1. detection --------------------------------------------------------------------------
def detection(work: Path, corpus) -> None:
    benign, outside = work / "benign", work / "outside"
    corpus.build_benign_tokenizer(benign)
    outside.mkdir()
    (outside / "merges.txt").write_text("#version: 0.2\n")
    from warden.policy import policy_from_mapping
    from warden.tokenscan import TokenscanPolicy

    policy = policy_from_mapping(corpus.TEST_POLICY, TokenscanPolicy)  # the tests' policy: .json cap 1 MiB
    ps, ms = tool("picklescan"), tool("modelscan")
    rows = []
    for name in ["benign", *sorted(corpus.CASES)]:
        target = work / "cases" / name
        shutil.copytree(benign, target)
        if name != "benign":
            corpus.CASES[name].mutate(target, outside)
        ours = scan_directory(str(target), policy)
        found = ",".join(sorted({f.id for f in ours.findings if f.severity >= policy.fail_severity}))
        ps_rc = run_tool([ps, "-p", str(target)])[0] if ps else None
        ms_rc = run_tool([ms, "-p", str(target)])[0] if ms else None
        rows.append((name, ours.outcome(policy.fail_severity) == 1, found, ps_rc, ms_rc))
    print("\n## Detection: malicious corpus (and the benign tokenizer)\n")
    print("| case | warden tokenscan | picklescan | modelscan |")
    print("|---|---|---|---|")

    def verdict(rc: int | None, flagged: int = 1) -> str:
        return "n/a" if rc is None else ("caught" if rc == flagged else f"missed (rc {rc})")

    for name, ours_hit, found, ps_rc, ms_rc in rows:
        mine = ("caught: " + found) if ours_hit else "clean"
        if name == "benign":
            print(f"| **benign** (false positive?) | {mine} | {verdict(ps_rc)} | {verdict(ms_rc)} |")
        else:
            print(f"| {name} | {mine} | {verdict(ps_rc)} | {verdict(ms_rc)} |")
    bad = rows[1:]
    totals = (sum(r[1] for r in bad), sum(r[3] == 1 for r in bad), sum(r[4] == 1 for r in bad))
    print(f"| **caught, of {len(bad)}** | **{totals[0]}** | **{totals[1]}** | **{totals[2]}** |")
    print(
        "\n(picklescan exit codes: 0 clean, 1 infected, 2 error; modelscan: 0 clean, 1 issues, 2 error, "
        "3 no supported files.)"
    )


# -- 2. a large model directory ------------------------------------------------------------
def safetensors_shard(path: Path, size: int, pool: bytes) -> None:
    count = size // 4
    header = json.dumps({"w": {"dtype": "F32", "shape": [count], "data_offsets": [0, count * 4]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        left = count * 4
        while left:
            piece = pool[: min(left, len(pool))]
            fh.write(piece)
            left -= len(piece)


def build_model_dir(work: Path, corpus, size_mb: int) -> Path:
    model = work / "model"
    corpus.build_benign_tokenizer(work / "tok-for-model")
    corpus.build_benign_model(work / "tok-for-model", model)
    shards = 4
    pool = os.urandom(16 * MIB)
    for i in range(shards):
        safetensors_shard(model / f"model-{i + 1:05d}-of-{shards:05d}.safetensors", size_mb * MIB // shards, pool)
    (model / "model.safetensors").unlink()
    return model


def threaded_sha256(root: Path) -> None:
    files = [Path(d) / f for d, _, names in os.walk(root) for f in names]

    def one(path: Path) -> str:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()

    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(one, files))


def model_dir_bench(work: Path, corpus, size_mb: int, repeat: int) -> None:
    model = build_model_dir(work, corpus, size_mb)
    total = sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    policy = default_policy()
    threaded_sha256(model)  # warm the page cache
    assert scan_directory(str(model), policy).findings == []
    anchor = best_of(repeat, lambda: threaded_sha256(model))
    full = best_of(repeat, lambda: scan_directory(str(model), policy, with_manifest=True))
    quick = best_of(repeat, lambda: scan_directory(str(model), policy, with_manifest=False))
    ps, ms = tool("picklescan"), tool("modelscan")
    rows = [
        ("anchor: threaded hashlib sha256 of every file", anchor),
        ("warden: scan + SHA-256 manifest (sidecar, trainer guard)", full),
        ("warden: scan without manifest (CLI default)", quick),
    ]
    if ps:
        rows.append(
            (
                "picklescan -p DIR (process, incl. start-up)",
                min(run_tool([ps, "-p", str(model)])[1] for _ in range(repeat)),
            )
        )
    if ms:
        rows.append(
            (
                "modelscan -p DIR (process, incl. start-up)",
                min(run_tool([ms, "-p", str(model)])[1] for _ in range(repeat)),
            )
        )
    print(f"\n## One model directory: {total / MIB:.0f} MiB ({len(list(model.iterdir()))} files), page cache warm\n")
    print("| what | seconds | MiB/s | ratio to anchor |")
    print("|---|---|---|---|")
    for label, secs in rows:
        print(f"| {label} | {secs:.3f} | {total / MIB / secs:.0f} | {secs / anchor:.2f} |")


# -- 3. many tokenizer directories ---------------------------------------------------------
def many_dirs_bench(work: Path, corpus, count: int, repeat: int) -> None:
    base = work / "tok-base"
    corpus.build_benign_tokenizer(base)
    same, distinct = work / "same", work / "distinct"
    for i in range(count):
        shutil.copytree(base, same / f"tok-{i:03d}")
        shutil.copytree(base, distinct / f"tok-{i:03d}")
        template = distinct / f"tok-{i:03d}" / "chat_template.jinja"
        template.write_text(template.read_text() + f"{{# variant {i} #}}")
    policy = default_policy()
    dirs_same = sorted(str(p) for p in same.iterdir())
    dirs_distinct = sorted(str(p) for p in distinct.iterdir())

    def scan_all(dirs: list[str], cold: bool) -> None:
        if cold:  # no cached renders, and the sandbox worker starts afresh
            ct._CACHE.clear()
            ct.stop_worker()
        for d in dirs:
            assert scan_directory(d, policy).findings == []

    cold_same = best_of(repeat, lambda: scan_all(dirs_same, True))
    warm_same = best_of(repeat, lambda: scan_all(dirs_same, False))
    cold_distinct = best_of(1, lambda: scan_all(dirs_distinct, True))
    cli = best_of(
        repeat,
        lambda: subprocess.run(
            [sys.executable, "-m", "sidecars.cli", "scan", "tokenizer", *dirs_same],
            capture_output=True,
            cwd=ROOT,
            check=True,
        ),
    )
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(dirs_same[0], local_files_only=True)
    load = best_of(repeat, lambda: [AutoTokenizer.from_pretrained(d, local_files_only=True) for d in dirs_same])
    rows = [
        ("anchor: AutoTokenizer.from_pretrained of each (in-process)", load),
        ("warden: scan, same template (1 render + worker start-up)", cold_same),
        ("warden: scan, same template (render cache warm: sidecar rescans)", warm_same),
        (f"warden: scan, {count} distinct templates ({count} renders, one worker)", cold_distinct),
        ("warden scan tokenizer DIR... (one CLI process, incl. start-up)", cli),
    ]
    for name in ("picklescan", "modelscan"):
        exe = tool(name)
        if exe:
            rows.append(
                (f"{name} -p PARENT (one process)", min(run_tool([exe, "-p", str(same)])[1] for _ in range(repeat)))
            )
    print(f"\n## {count} tokenizer directories (byte-level BPE, tokenizer.json + config + chat template)\n")
    print("| what | seconds | ms per directory | ratio to anchor |")
    print("|---|---|---|---|")
    for label, secs in rows:
        print(f"| {label} | {secs:.3f} | {1000 * secs / count:.1f} | {secs / load:.2f} |")


# -- 4. behaviour: the attack corpus and the family fixtures, side by side -------------------------
TOOL_ENV = {**os.environ, "PROMPTFOO_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
FICKLING = (
    "import os, sys, fickling\n"
    "bad = False\n"
    "for d, _, names in os.walk(sys.argv[1]):\n"
    "    for n in names:\n"
    "        try:\n"
    "            bad |= not fickling.is_likely_safe(os.path.join(d, n))\n"
    "        except Exception:\n"
    "            pass\n"
    "sys.exit(1 if bad else 0)\n"
)


def other_scanners() -> dict[str, Callable[[Path], list[str]]]:
    """Each scanner as a command line on one directory; exit 1 means it flagged something."""
    found: dict[str, Callable[[Path], list[str]]] = {}
    for name, args in (("picklescan", ["-p"]), ("modelscan", ["-p"]), ("modelaudit", ["scan"])):
        exe = tool(name)
        if exe:
            found[name] = lambda d, exe=exe, args=args: [exe, *args, str(d)]
    if importlib.util.find_spec("fickling"):
        found["fickling"] = lambda d: [sys.executable, "-c", FICKLING, str(d)]
    return found


def run_scanner(cmd: list[str]) -> tuple[int, float]:
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=300, env=TOOL_ENV)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc = -9
    return rc, time.perf_counter() - start


def behaviour_bench(work: Path) -> None:
    from tests.warden.tokenscan.attacks import all_cases, build_corpus
    from tests.warden.tokenscan.families import FAMILIES, build_family

    cases = all_cases()
    dirs = build_corpus(work / "attacks", cases)
    families = {n: build_family(n, work / "families" / n) for n in FAMILIES}
    policy = default_policy()
    scanners = other_scanners()
    names = ["warden", *scanners]
    caught = {n: {} for n in names}  # scanner -> case -> rc / flagged
    seconds = dict.fromkeys(names, 0.0)
    expected = {c.name: c.expected for c in cases}
    rows = [(c.name, c.klass, dirs[c.name]) for c in cases] + [(f, "benign family", p) for f, p in families.items()]
    for case, _klass, path in rows:
        start = time.perf_counter()
        result = scan_directory(str(path), policy)
        seconds["warden"] += time.perf_counter() - start
        violation = result.outcome(policy.fail_severity) == 1
        # an attack counts for us only when it raised the finding id the generator names
        caught["warden"][case] = violation and (
            case not in expected or expected[case] in {f.id for f in result.findings}
        )
        for name, cmd in scanners.items():
            rc, secs = run_scanner(cmd(path))
            seconds[name] += secs
            caught[name][case] = rc == 1
    classes = list(dict.fromkeys(c.klass for c in cases))
    print("\n## Behaviour: attack corpus by class (cases caught) and benign families (false positives)\n")
    print("| class | cases | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for klass in classes:
        members = [c.name for c in cases if c.klass == klass]
        cells = [str(sum(caught[n][m] for m in members)) for n in names]
        print(f"| {klass} | {len(members)} | " + " | ".join(cells) + " |")
    total = [str(sum(caught[n][c.name] for c in cases)) for n in names]
    print(f"| **all attacks** | **{len(cases)}** | " + " | ".join(f"**{t}**" for t in total) + " |")
    fps = [str(sum(caught[n][f] for f in families)) for n in names]
    print(f"| **benign families flagged** | {len(families)} | " + " | ".join(fps) + " |")
    print("| seconds (all directories) | | " + " | ".join(f"{seconds[n]:.1f}" for n in names) + " |")
    print("\n| case | class | expected | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for c in cases:
        marks = ["caught" if caught[n][c.name] else "-" for n in names]
        print(f"| {c.name} | {c.klass} | {c.expected} | " + " | ".join(marks) + " |")
    print("\n(exit 1 = flagged, for every tool; modelaudit exits 2 for an incomplete scan, counted as not caught)")


# -- 5. speed: many realistic tokenizers against hashing their bytes ---------------------------------
def big_tokenizer(out: Path, vocab: int, seed: int) -> None:
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 12))) for _ in range(vocab * 2)]
    lines = [" ".join(rng.choice(words) for _ in range(30)) for _ in range(4000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(lines, trainer=trainer)
    out.mkdir(parents=True)
    tok.save(str(out / "tokenizer.json"))
    from tests.warden.tokenscan.families import QWEN25_TEMPLATE

    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
              "tokenizer_class": "Qwen2Tokenizer", "chat_template": QWEN25_TEMPLATE}  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(config))


def speed_bench(work: Path, count: int, vocab: int, repeat: int, distinct_count: int, shard_mb: int) -> None:
    """Cold = a fresh scanner: no cached parse, load, render or judgement, both sandbox workers
    stopped (their interpreter start is counted). ``scan_paths`` is what the CLI runs."""
    from warden.tokenscan import scanner as sc
    from warden.tokenscan import tokenizer_behaviour as tbe

    distinct = [work / f"base-{i}" for i in range(distinct_count)]
    for i, d in enumerate(distinct):
        big_tokenizer(d, vocab, i)
    mixed = [work / "mixed" / f"tok-{i:03d}" for i in range(count)]  # the distinct ones, copied round-robin
    node = [work / "node" / f"ckpt-{i:03d}" for i in range(count)]  # one tokenizer in every checkpoint
    ckpts = [work / "ckpts" / f"step-{i:03d}" for i in range(count)]  # and a weights shard beside it
    pool = os.urandom(4 * MIB)
    for i, (m, n, c) in enumerate(zip(mixed, node, ckpts, strict=True)):
        shutil.copytree(distinct[i % len(distinct)], m)
        shutil.copytree(distinct[0], n)
        shutil.copytree(distinct[0], c)
        safetensors_shard(c / "model.safetensors", shard_mb * MIB, pool)
    policy = default_policy()

    def cold() -> None:
        ct._CACHE.clear()
        sc.default_resources().clear()  # every cached parse, answer, judgement and verdict
        ct.stop_worker()
        tbe.stop_worker()

    def scan_all(dirs: list[Path], manifest: bool, hashes: HashCache | None = None) -> None:
        for result in sc.scan_paths([str(d) for d in dirs], policy, with_manifest=manifest, hash_cache=hashes):
            assert result.findings == [], result.root

    def load_alone() -> None:  # the floor: a sandboxed `tokenizers` load of each distinct file
        for d in distinct:
            path = d / "tokenizer.json"
            data = path.read_bytes()
            answer = tbe.run(tbe.request("tokenizer", str(path), hashlib.sha256(data).hexdigest(), len(data), {}),
                             policy.behaviour.memory_cap, policy.behaviour.timeout_seconds)  # fmt: skip
            assert answer["status"] == "ok", answer

    rows: list[tuple[str, float, float]] = []
    sets = (
        (f"{len(distinct)} distinct tokenizers, copied", mixed, (False, True)),
        ("node: one tokenizer in every directory", node, (False, True)),
        (f"node: checkpoints (that tokenizer + a {shard_mb} MiB shard)", ckpts, (True,)),
    )
    for label, dirs, manifests in sets:
        root = dirs[0].parent
        total = sum(p.stat().st_size for d in dirs for p in d.iterdir())
        threaded_sha256(root)
        anchor = best_of(repeat, lambda root=root: threaded_sha256(root))
        scan_all(dirs, False)  # warm the page cache and the interpreter
        rows.append((f"{label}: anchor, threaded sha256 of every file ({total / MIB:.0f} MiB)", anchor, anchor))
        if False in manifests:  # without a manifest a weights shard is sniffed, not hashed: not comparable
            rows.append((f"{label}: warden cold, no manifest (CLI default)",
                         best_of(repeat, lambda dirs=dirs: (cold(), scan_all(dirs, False))), anchor))  # fmt: skip
        rows.append((f"{label}: warden cold, with the SHA-256 manifest (sidecar, --state-dir)",
                     best_of(repeat, lambda dirs=dirs: (cold(), scan_all(dirs, True))), anchor))  # fmt: skip
        # warm: what the sidecar does (a manifest; the files' digests by stat key, the stored
        # verdicts), and the same rehashing every file (no stat cache)
        hashes = HashCache()
        rows.append((f"{label}: warden warm (sidecar rescans: manifest, stat-keyed hash cache)",
                     best_of(repeat, lambda dirs=dirs, h=hashes: scan_all(dirs, True, h)), anchor))  # fmt: skip
        rows.append((f"{label}: warden warm, rehashing every file (no stat cache)",
                     best_of(repeat, lambda dirs=dirs: scan_all(dirs, True)), anchor))  # fmt: skip
    one = sum((d / "tokenizer.json").stat().st_size for d in distinct)
    hash_distinct = best_of(repeat, lambda: [hashlib.sha256((d / "tokenizer.json").read_bytes()) for d in distinct])
    load_alone()
    rows.append((f"floor: sha256 of the {len(distinct)} distinct tokenizer.json ({one / MIB:.1f} MiB, one thread)",
                 hash_distinct, hash_distinct))  # fmt: skip
    rows.append(("floor: their sandboxed tokenizers load + corpus (worker warm)",
                 best_of(repeat, load_alone), hash_distinct))  # fmt: skip
    tbe.stop_worker()
    rows.append(("floor: the same, worker cold (interpreter start counted once)",
                 best_of(repeat, lambda: (tbe.stop_worker(), load_alone())), hash_distinct))  # fmt: skip
    load = os.getloadavg()[0]
    print(f"\n## Speed: {count} tokenizers ({vocab}-token byte-level BPE), scan_paths, load average {load:.2f}\n")
    print("| what | seconds | ms per directory | ratio to its hashing anchor |")
    print("|---|---|---|---|")
    for label, secs, anchor in rows:
        print(f"| {label} | {secs:.3f} | {1000 * secs / count:.1f} | {secs / anchor:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=500)
    parser.add_argument("--dirs", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--distinct", type=int, default=5, help="distinct tokenizers among --dirs (speed)")
    parser.add_argument("--shard-mb", type=int, default=16, help="weights beside each checkpoint's tokenizer (speed)")
    parser.add_argument("--skip", nargs="*", default=(), choices=("detection", "model", "dirs", "behaviour", "speed"))
    args = parser.parse_args()
    corpus = load_corpus_module()
    print(f"# tokenscan benchmark ({os.cpu_count()} CPUs, Python {sys.version.split()[0]})")
    for name in ("picklescan", "modelscan", "modelaudit", "fickling"):
        print(f"- {name}: {tool(name) or 'not installed (pip install ' + name + ')'}")
    with tempfile.TemporaryDirectory(prefix="bench-tokenscan-") as tmp:
        work = Path(tmp)
        if "detection" not in args.skip:
            detection(work / "detection", corpus)
        if "model" not in args.skip:
            model_dir_bench(work / "model", corpus, args.size_mb, args.repeat)
        if "dirs" not in args.skip:
            many_dirs_bench(work / "dirs", corpus, args.dirs, args.repeat)
        if "behaviour" not in args.skip:
            behaviour_bench(work / "behaviour")
        if "speed" not in args.skip:
            speed_bench(work / "speed", args.dirs, args.vocab, args.repeat, args.distinct, args.shard_mb)


if __name__ == "__main__":
    main()
