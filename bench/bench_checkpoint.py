#!/usr/bin/env python3
"""Checkpoints at node scale: each figure of a real run beside its anchor, measured in the same run.

Runs Warden's trainer on the benchmark model (bench/gpu_figures.py's assets: a ~0.5B Llama, 64
prompts, bf16 autocast over float32 master weights) with a checkpoint every ``--every`` steps,
``keep_last: 2``, ``checkpoint.serialization: shards`` and the signer sidecar attached (same
serialization, so it signs against the trainer's announcement). Then, in the same process:

- a synchronous run of the same config (one checkpoint), for the stall as it was;
- ``--resume auto`` from the newest signed checkpoint (trusted keys set) against a fresh start,
  the page cache dropped before both;
- the anchors, on the newest checkpoint's own bytes: write + fsync of the same sizes, the
  GPU -> pinned host copy of the same byte count, a cold parallel read (page cache dropped) and
  all-thread SHA-256 (16 equal slices, warm).

Figures: the stall of a checkpointing step (the time the training thread spent in the save; the
wait for a previous save is reported apart), checkpoint durable (save start to renamed, fsynced),
``checkpoint.saved`` -> ``.sig``, and the resume overhead. Ratios are ours / anchor (lower is better).

    python3 bench/bench_checkpoint.py --steps 6 --every 2          # the GPU run ($OUT/bench_checkpoint.json)
    .venv/bin/python bench/bench_checkpoint.py --tiny --device cpu   # a minute-long check of the script
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import yaml

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH)]

from bench_hashing import all_files, sha256_slices, slices  # noqa: E402
from bench_sign_latency import start_sidecar  # noqa: E402
from gpu_figures import FULL, TINY, build_assets, log  # noqa: E402

GB = 1e9
MIB = 1 << 20


def drop_page_cache() -> str:
    """Drops the whole page cache (root only); says whether it could."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return "dropped"
    except OSError as exc:
        return f"NOT dropped ({exc.strerror}): cold figures are warm"


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def config(assets: dict[str, Any], size: dict[str, int], args: argparse.Namespace, mode: str, pub: str) -> dict:
    return {
        "version": 1,
        "run": {"seed": 1, "device": args.device, "metrics_port": 0, "console": False, "run_id": "bench-ckpt"},
        "model": {"actor_path": assets["model"], "dtype": args.dtype},
        "data": {"train_files": [assets["prompts"]], "max_prompt_tokens": 32, "truncation": "left"},
        "reward": {"kind": "rule", "rule": "digits"},
        "rollout": {"engine": "hf", "n": 1, "max_new_tokens": size["tokens"], "progress": False, "static_cache": "off"},
        "ppo": {
            "train_batch_size": size["batch"],
            "mini_batch_size": size["batch"],
            "micro_batch_size": size["micro"],
            "epochs": 1,
            "actor_lr": 1e-6,
            "critic_lr": 1e-6,
        },
        "snapshot": {"top_k": 4},
        "checkpoint": {
            "every_steps": args.every,
            "keep_last": 2,
            "serialization": "shards",
            "shard_size": args.shard_size,
            "async_save": mode,
            "trusted_keys": pub,
        },
        "max_steps": 10_000,
    }


def build_trainer(raw: dict, run_dir: str, resume: str) -> tuple[Any, float]:
    from trainer.config import load_config
    from trainer.core import PPOTrainer

    path = os.path.join(os.path.dirname(run_dir), os.path.basename(run_dir) + ".yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(raw, fh)
    t0 = time.perf_counter()
    trainer = PPOTrainer(load_config(path), run_dir, resume=resume, serve_metrics=False)
    return trainer, time.perf_counter() - t0


def empty_host_cache() -> str:
    """Frees the pinned host blocks torch keeps cached after they are released; says how (or why not)."""
    gc.collect()
    if not torch.cuda.is_available():
        return "no CUDA"
    torch.cuda.empty_cache()
    for owner, name in ((getattr(torch, "accelerator", None), "empty_host_cache"), (torch._C, "_host_emptyCache")):
        call = getattr(owner, name, None)
        if call is not None:
            call()
            return f"emptied ({name})"
    return "not emptied (no API in this torch)"


def release(trainer: Any) -> None:
    trainer.close()
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class SigWatcher:
    """Notes the wall time each ``step-N.sig`` first appears under ``root`` (polls every 5 ms):
    retention removes old checkpoints with their signatures, so they are timed as they come."""

    def __init__(self, root: str) -> None:
        self.root, self._stop = root, threading.Event()
        self.seen: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            try:
                names = os.listdir(self.root)
            except OSError:
                continue
            now = time.time()
            for name in names:
                if name.endswith(".sig") and name not in self.seen:
                    self.seen[name] = now

    def wait_for(self, name: str, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while name not in self.seen and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.seen.get(name)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class NullSink:
    """Takes what a fill writes and keeps nothing: the fill's own cost, without any copy."""

    def bytes(self, relative: str, payload: bytes) -> None:
        pass

    def json(self, relative: str, obj: Any) -> None:
        from trainer.checkpoint import json_bytes

        json_bytes(obj)

    def tensors(self, relative: str, tensors: dict, metadata: dict | None = None) -> None:
        pass


def capture_breakdown(trainer: Any, device: str) -> dict[str, Any]:
    """The stall taken apart, on the trainer's own state: the fill alone, and the capture."""
    from trainer.staging import capture

    arena = trainer.saver.arena
    if arena is None:
        return {}
    dev = torch.device(device)
    out: dict[str, Any] = {"pinned": bool(arena.chunks[0].is_pinned())}
    t0 = time.perf_counter()
    trainer._fill_checkpoint(NullSink())
    out["fill_only_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    capture(trainer._fill_checkpoint, arena, dev)
    out["capture_s"] = time.perf_counter() - t0
    log("capture breakdown: " + ", ".join(f"{k} {v}" for k, v in out.items()))
    return out


def journal_events(run_dir: str, etype: str) -> list[Any]:
    from warden import journal as ev

    reader = ev.JournalReader(os.path.join(run_dir, ev.JOURNAL_NAME))
    return [e for e, _ in reader.read_available() if e.type == etype]


def train_steps(trainer: Any, steps: int, device: str) -> list[dict[str, float]]:
    """``steps`` steps, a save every ``every_steps``; per step its time and the time spent saving."""
    rows = []
    every = trainer.cfg.checkpoint.every_steps
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        trainer.train_step()
        sync(device)
        t1 = time.perf_counter()
        if every and trainer.step % every == 0:
            trainer.save_checkpoint()
        sync(device)
        t2 = time.perf_counter()
        rows.append({"step": trainer.step, "train_s": t1 - t0, "save_s": t2 - t1})
        log(f"step {trainer.step}: train {t1 - t0:.2f} s, save {t2 - t1:.2f} s")
    return rows


# -- anchors ----------------------------------------------------------------------------------
def write_fsync_anchor(files: list[Path], scratch: Path) -> float:
    """Writes files of the same sizes (bytes read first, not timed) with write + fsync, as a plain writer."""
    payloads = [p.read_bytes() for p in files]
    scratch.mkdir()
    t0 = time.perf_counter()
    for index, data in enumerate(payloads):
        fd = os.open(scratch / f"f{index}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[: 64 * MIB]) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    os.sync()
    took = time.perf_counter() - t0
    for index in range(len(payloads)):
        os.unlink(scratch / f"f{index}")
    return took


def pinned_copy_anchor(nbytes: int, device: str) -> float | None:
    """One device buffer of ``nbytes`` copied into pinned host memory (best of 3); None on CPU."""
    if device != "cuda":
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    del src, dst
    return best


def cold_read_anchor(files: list[Path], workers: int) -> tuple[float, str]:
    """Every byte read once by ``workers`` threads in equal slices, the page cache dropped first."""
    how = drop_page_cache()
    parts = slices(files, workers)

    def one(part: list[tuple[Path, int, int]]) -> None:
        buf = bytearray(16 * MIB)
        view = memoryview(buf)
        for path, start, end in part:
            fd = os.open(path, os.O_RDONLY)
            try:
                pos = start
                while pos < end:
                    pos += os.preadv(fd, [view[: min(16 * MIB, end - pos)]], pos) or (end - pos)
            finally:
                os.close(fd)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, parts))
    return time.perf_counter() - t0, how


def hash_anchor(files: list[Path], workers: int) -> float:
    """All-thread SHA-256 of the same bytes in ``workers`` equal slices, warm (best of 2)."""
    parts = slices(files, workers)
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        sha256_slices(parts)
        best = min(best, time.perf_counter() - t0)
    return best


# -- the run ------------------------------------------------------------------------------------
def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def signer_policy(path: Path, private_key: str, shard_size: int) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "signing_key": private_key,
                "serialization": "shards",
                "shard_size": shard_size,
                "check_interval_seconds": 0.2,
                "stable_seconds": 3600,
                "rescan_seconds": 3600,
                "reverify_interval_seconds": 0,
            }
        )
    )


def async_run(raw: dict, run_dir: Path, args: argparse.Namespace, scratch: Path, private_key: str) -> dict[str, Any]:
    """The run with asynchronous saves and the signer attached: steps, saves, signatures."""
    from trainer import checkpoint as ckpt

    (run_dir / "checkpoints").mkdir(parents=True)
    policy = scratch / "signer.yaml"
    signer_policy(policy, private_key, args.shard_size)
    proc, port = start_sidecar(run_dir, policy, 0.02, scratch / "signer.log")
    watcher = SigWatcher(str(run_dir / "checkpoints"))
    try:
        trainer, start_s = build_trainer(raw, str(run_dir), "never")
        arena = trainer.saver.arena.nbytes if trainer.saver.arena is not None else 0
        rows = train_steps(trainer, args.steps, args.device)
        t0 = time.perf_counter()
        trainer.saver.wait()
        final_wait = time.perf_counter() - t0
        capture_parts = capture_breakdown(trainer, args.device)
        release(trainer)
        saved = journal_events(str(run_dir), "checkpoint.saved")
        sig = {}
        for event in saved:
            seen = watcher.wait_for(os.path.basename(event.data["path"]) + ".sig", args.sig_timeout)
            sig[event.step] = None if seen is None else seen - epoch(event.time)
        signing = signer_sign_seconds(port)
    finally:
        watcher.stop()
        proc.terminate()
        proc.wait(30)
    newest = ckpt.list_complete(str(run_dir / "checkpoints"))[0]
    return {
        "start_s": start_s,
        "arena_bytes": arena,
        "rows": rows,
        "final_wait_s": final_wait,
        "capture": capture_parts,
        "saves": [
            {"step": e.step, **{k: e.data.get(k) for k in ("stall_seconds", "waited_seconds", "write_seconds")}}
            for e in saved
        ],
        "sig_s": sig,
        "signer_sign_s": signing,
        "newest": newest.path,
        "last_step": newest.step,
    }


def signer_sign_seconds(port: int) -> float | None:
    """The signer's own mean time in ``sign_checkpoint`` (scan, hash, sign, write the .sig), from its
    ``warden_signer_hash_duration_seconds{operation="sign"}``; the rest of checkpoint.saved -> .sig is
    noticing the event and what comes before the hash."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        for part in ("sum", "count"):
            if line.startswith(f"warden_signer_hash_duration_seconds_{part}{{") and 'operation="sign"' in line:
                values[part] = float(line.rsplit(" ", 1)[1])
    return values["sum"] / values["count"] if values.get("count") else None


def resume_figures(raw: dict, run_dir: Path, scratch: Path, last_step: int) -> dict[str, Any]:
    """``--resume auto`` against a fresh start, the page cache dropped and torch's cache of pinned host
    memory emptied before each: both allocate their staging arena afresh (one reusing the other's
    cached block would hide or add seconds of pinning that are not the resume's)."""
    how = drop_page_cache()
    host = empty_host_cache()
    fresh, fresh_s = build_trainer(raw, str(scratch / "fresh-run"), "never")
    release(fresh)
    del fresh  # its arena too: both starts allocate theirs afresh
    drop_page_cache()
    empty_host_cache()
    resumed, resume_s = build_trainer(raw, str(run_dir), "auto")
    step = resumed.step
    release(resumed)
    if step != last_step:
        raise SystemExit(f"resumed at step {step}, expected {last_step}")
    resumed_events = journal_events(str(run_dir), "run.resumed")
    parts = resumed_events[-1].data.get("load_seconds") if resumed_events else None
    return {
        "fresh_s": fresh_s,
        "resume_s": resume_s,
        "overhead_s": resume_s - fresh_s,
        "cache": how,
        "host_cache": host,
        "load_seconds": parts,
    }


def row(name: str, ours: float | None, anchor_name: str, anchor: float | None) -> str:
    if ours is None:
        return f"| {name} | - | {anchor_name} | - | - |"
    shown = "-" if anchor is None else f"{anchor:.3f}"
    ratio = "-" if not anchor else f"{ours / anchor:.2f}x"
    return f"| {name} | {ours:.3f} | {anchor_name} | {shown} | {ratio} |"


def report(res: dict[str, Any]) -> list[str]:
    a, s, r, k = res["async"], res["sync"], res["resume"], res["anchors"]
    every = res["args"]["every"]
    normal = [x["train_s"] for x in a["rows"]]
    saves = [x for x in a["saves"] if x["stall_seconds"] is not None]
    stall = statistics.median(x["stall_seconds"] for x in saves)
    step_stall = statistics.median(x["save_s"] for x in a["rows"] if x["step"] % every == 0)
    waited_at = {x["step"]: x["waited_seconds"] or 0.0 for x in saves}
    unwaited = statistics.median(
        x["save_s"] - waited_at.get(x["step"], 0.0) for x in a["rows"] if x["step"] % every == 0
    )
    waited = [x["waited_seconds"] for x in saves]
    write = statistics.median(x["write_seconds"] for x in saves)
    sigs = [v for v in a["sig_s"].values() if v is not None]
    sync_stall = statistics.median(x["save_s"] for x in s["rows"] if x["step"] % every == 0)
    size = res["checkpoint_bytes"]
    lines = [
        f"checkpoint {size / GB:.2f} GB in {res['checkpoint_files']} files; host buffer {a['arena_bytes'] / GB:.2f} GB;"
        f" a normal step {statistics.median(normal):.2f} s (median of {len(normal)});"
        f" a save every {every} steps; page cache {r['cache']}",
        "",
        "| figure | ours, s | anchor (same run) | anchor, s | ratio |",
        "|---|---|---|---|---|",
        row(
            "stall of a saving step, sync (as before)",
            sync_stall,
            "disk write + fsync of the same bytes",
            k["write_fsync_s"],
        ),
        row(
            "stall of a saving step, async (training thread in save)",
            step_stall,
            "GPU -> pinned copy, same bytes",
            k["pinned_copy_s"],
        ),
        row(
            "  less the waits for a previous save (the goal's stall)",
            unwaited,
            "GPU -> pinned copy, same bytes",
            k["pinned_copy_s"],
        ),
        row("  of it: copy into host buffers (saver)", stall, "GPU -> pinned copy, same bytes", k["pinned_copy_s"]),
        row(
            "checkpoint durable (save start -> renamed)",
            write,
            "disk write + fsync of the same bytes",
            k["write_fsync_s"],
        ),
        row(
            "checkpoint.saved -> .sig (median)",
            statistics.median(sigs) if sigs else None,
            "all-thread SHA-256 of the files",
            k["hash_s"],
        ),
        row("  of it: the signer's scan, hash, sign and write (mean)", a["signer_sign_s"], "same", k["hash_s"]),
        row(
            "--resume auto minus a fresh start",
            r["overhead_s"],
            "cold read + all-thread hash",
            k["cold_read_s"] + k["hash_s"],
        ),
        "",
        f"waits for a previous save (reported apart): {sum(1 for w in waited if w > 0)} of {len(waited)} saves,"
        f" {sum(waited):.2f} s in all; the final save's wait {a['final_wait_s']:.2f} s",
        "the capture taken apart (re-run after the training, same state): "
        + ", ".join(
            f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
            for key, value in a["capture"].items()
        ),
        f"resume {r['resume_s']:.2f} s (loading the checkpoint: {r['load_seconds']}), fresh start {r['fresh_s']:.2f} s;"
        f" pinned host cache {r.get('host_cache')}; shards of {res['args']['shard_size'] // MIB} MiB;"
        f" cold read {k['cold_read_s']:.3f} s"
        f" ({size / k['cold_read_s'] / GB:.2f} GB/s), hash {k['hash_s']:.3f} s ({size / k['hash_s'] / GB:.2f} GB/s)",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny model (a check of the script)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--steps", type=int, default=6, help="steps of the asynchronous run (default 6)")
    parser.add_argument("--every", type=int, default=2, help="checkpoint interval in steps (default 2)")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per response (default 128)")
    parser.add_argument("--shard-size", type=int, default=256 * MIB, help="shards serialization's size")
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1), help="anchor threads")
    parser.add_argument("--sig-timeout", type=float, default=120.0, help="seconds to wait for each .sig")
    parser.add_argument("--scratch", default=None, help="scratch parent (default: the system temp dir)")
    args = parser.parse_args()
    size = {**(TINY if args.tiny else FULL), "tokens": TINY["tokens"] if args.tiny else args.tokens}
    from warden.signing.keys import generate_keypair

    with tempfile.TemporaryDirectory(prefix="warden-bench-ckpt-", dir=args.scratch) as tmp:
        scratch = Path(tmp)
        assets = build_assets(str(scratch / "assets"), size, args.device, getattr(torch, args.dtype))
        keys = generate_keypair(scratch / "keys")
        pub = str(keys.public_key)
        log("sync run (one checkpoint)")
        trainer, _ = build_trainer(config(assets, size, args, "off", pub), str(scratch / "sync-run"), "never")
        sync_rows = train_steps(trainer, args.every, args.device)
        release(trainer)
        subprocess.run(["rm", "-rf", str(scratch / "sync-run")], check=True)
        log("async run with the signer attached")
        raw = config(assets, size, args, "on", pub)
        run_dir = scratch / "run"
        res_async = async_run(raw, run_dir, args, scratch, str(keys.private_key))
        files = sorted(all_files(Path(res_async["newest"])))
        total = sum(p.stat().st_size for p in files)
        log("resume against a fresh start")
        res_resume = resume_figures(raw, run_dir, scratch, res_async["last_step"])
        log("anchors")
        anchors = {
            "write_fsync_s": write_fsync_anchor(files, scratch / "anchor-write"),
            "pinned_copy_s": pinned_copy_anchor(total, args.device),
        }
        anchors["cold_read_s"], _ = cold_read_anchor(files, args.workers)
        anchors["hash_s"] = hash_anchor(files, args.workers)
    result = {
        "args": vars(args),
        "size": size,
        "params": assets["params"],
        "checkpoint_bytes": total,
        "checkpoint_files": len(files),
        "sync": {"rows": sync_rows},
        "async": res_async,
        "resume": res_resume,
        "anchors": anchors,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
    }
    lines = report(result)
    print("\n".join(lines), flush=True)
    out = os.environ.get("OUT") or str(ROOT / "bench-checkpoint-out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench_checkpoint.json"), "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    with open(os.path.join(out, "bench_checkpoint.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
