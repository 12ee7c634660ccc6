"""The node-loss drill's timings (issue 22 part 2): kill -> first survivor step, steps/s before and after.

Three torchrun agents on loopback (gloo, the tests' tiny model, one worker each) with a real
signer and archiver; one agent and its worker are SIGKILLed while step ``--kill-after + 1``
runs; the two survivors re-rendezvous, resume from the newest signed checkpoint and finish.
The machinery is tests/elastic_drill.py (shared with tests/e2e/test_elastic_drill.py).

    .venv/bin/python bench/bench_elastic.py [--steps 10] [--kill-after 5] [--keep DIR]

Prints the seconds from the kill to the first step completed by the survivors (rendezvous,
process start, model load, signed-checkpoint verification and one step), the steps/s of the
3-node and of the 2-node run (each between its own steps, warm-up excluded) and their ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from elastic_drill import ElasticDrill, measure  # noqa: E402

from warden import journal as ev  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--kill-after", type=int, default=5, help="kill a node while the next step runs")
    parser.add_argument("--keep", help="run in this directory and keep it (logs, journal, store)")
    parser.add_argument(
        "--share-agent-store",
        action="store_true",
        help="torch's default (TORCH_DISABLE_SHARE_RDZV_TCP_STORE unset): workers reuse the agent's store",
    )
    args = parser.parse_args()
    base = Path(args.keep or tempfile.mkdtemp(prefix="warden-elastic-"))
    base.mkdir(parents=True, exist_ok=True)
    drill = ElasticDrill(base / "drill", steps=args.steps, kill_after_step=args.kill_after)
    if args.share_agent_store:
        drill.extra_env = {}
    drill.write_config(str(base / "tiny"))  # builds the tiny assets there
    try:
        drill.start()
        victim = drill.lose_a_node()
        drill.finish()
        drill.drain(args.steps)
    finally:
        drill.close()
    events = drill.events()
    figures = measure(events, drill.kill_time)
    resumed = next(e for e in events if e.type == ev.RUN_RESUMED)
    store = "shared agent store (torch default)" if args.share_agent_store else "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    print(f"{store}; killed {victim.name} (agent + worker, SIGKILL) during step {args.kill_after + 1} of {args.steps}")
    print(
        f"resumed from step {resumed.data['from_step']}: world {resumed.data['old_world_size']} -> "
        f"{resumed.data['new_world_size']}, lost steps {figures.lost_steps}, restart {resumed.data['restart_count']}"
    )
    print(
        f"kill -> first step completed by the survivors: {figures.kill_to_first_step_s:.2f} s "
        f"(new generation's first event {figures.kill_to_restart_s:.2f} s, "
        f"run.resumed {figures.kill_to_resumed_s:.2f} s)"
    )
    print(
        f"steps/s: {figures.world_before} nodes {figures.steps_per_s_before:.3f}, "
        f"{figures.world_after} nodes {figures.steps_per_s_after:.3f}, ratio after/before {figures.ratio:.2f}"
    )
    if args.keep:
        print(f"files: {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
