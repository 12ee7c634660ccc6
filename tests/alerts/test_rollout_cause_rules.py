"""The generated recording rules and warden diagnose's table agree: seeded random facts go to both the
real promtool (as gauges) and :func:`warden.diagnose.causes.diagnose`; the series recorded must be exactly
the causes Python names, with the same values.

CI runs ``WARDEN_CAUSE_SAMPLES`` (default 60) seeded cases; set it higher (e.g. 2000) for a full run.
"""

from __future__ import annotations

import os
import random
import subprocess

import yaml
from support import ROOT, need_binary

from warden.diagnose import causes as c

SAMPLES = int(os.environ.get("WARDEN_CAUSE_SAMPLES", "60"))
SEED = int(os.environ.get("WARDEN_TEST_SEED", "32"))
RULES = os.path.join(ROOT, "alerts", "rules", "rollout-causes.yml")
LABELS = {"job": "trainer", "instance": "t:9460"}


def random_facts(rng: random.Random) -> c.Facts:
    """Facts from small grids that land on every threshold exactly as well as on either side."""

    def maybe(values):
        return None if rng.random() < 0.15 else rng.choice(values)

    step_s = maybe([0.0, 1.0, 2.0, 4.0])
    seqs = maybe([0, 8, 16])
    ranks = tuple(rng.choice([0.0, 0.4, 1.0, 1.5, 1.6, 3.0]) for _ in range(rng.choice([0, 1, 2, 3])))
    return c.Facts(
        step_s=step_s,
        data_s=maybe([0.0, 0.25, 0.49, 0.5, 1.0, 2.0]) if step_s is not None else None,
        generation_s=maybe([0.5, 1.0]) if step_s is not None else None,
        reward_s=maybe([0.0, 0.5, 0.99, 1.0, 3.0]) if step_s is not None else None,
        rank_rollout_s=ranks,
        max_num_seqs=seqs,
        running_max=rng.choice([0, 7, 8, 16]) if seqs is not None else None,
        waiting_max=rng.choice([0, 1, 5]) if seqs is not None else None,
        kv_cache_usage_max=rng.choice([0.5, 0.94, 0.95, 1.0]) if seqs is not None else None,
        preemptions_last=rng.choice([0, 0, 3]) if seqs is not None else None,
        gpu_util_max=maybe([5.0, 19.9, 20.0, 90.0]),
    )


def series(name: str, value: float, **extra: str) -> dict[str, str]:
    labels = ",".join(f'{k}="{v}"' for k, v in {**LABELS, **extra}.items())
    return {"series": f"{name}{{{labels}}}", "values": f"{value!r} {value!r}"}


def input_series(f: c.Facts) -> list[dict[str, str]]:
    out = []
    scalars = {
        c.STEP: f.step_s,
        c.MAX_NUM_SEQS: f.max_num_seqs,
        c.RUNNING_MAX: f.running_max,
        c.WAITING_MAX: f.waiting_max,
        c.KV_MAX: f.kv_cache_usage_max,
        c.PREEMPTED: f.preemptions_last,
    }
    out += [series(name, float(v)) for name, v in scalars.items() if v is not None]
    phases = {"data": f.data_s, "generation": f.generation_s, "reward": f.reward_s}
    out += [series(c.PHASE, float(v), phase=p) for p, v in phases.items() if v is not None]
    out += [series(c.RANK, float(v), rank=str(i)) for i, v in enumerate(f.rank_rollout_s)]
    if f.gpu_util_max is not None:  # the DCGM exporter: its own job and labels
        util = f.gpu_util_max
        out.append({"series": f'{c.GPU_UTIL}{{job="dcgm",gpu="0"}}', "values": f"{util!r} {util!r}"})
    return out


def expected(f: c.Facts) -> list[dict[str, object]]:
    out = []
    for finding in c.diagnose(f):
        labels = {**LABELS, "cause": finding.cause, "setting": finding.setting, "measure": finding.measure}
        inner = ",".join(f"{k}={yaml.safe_dump(v, default_style=chr(34)).strip()}" for k, v in labels.items())
        out.append({"labels": f"{c.RECORD}{{{inner}}}", "value": float(finding.value)})
    return out


def test_promtool_records_exactly_the_causes_python_names(tmp_path):
    promtool = need_binary("promtool")
    rng = random.Random(SEED)
    cases = [random_facts(rng) for _ in range(SAMPLES)]
    named = sum(1 for f in cases if c.diagnose(f))
    assert named >= SAMPLES // 4 and SAMPLES - named >= SAMPLES // 10, "the grid must produce both outcomes"
    tests = [
        {
            "interval": "1m",
            "input_series": input_series(f),
            "promql_expr_test": [{"expr": c.RECORD, "eval_time": "1m", "exp_samples": expected(f)}],
        }
        for f in cases
    ]
    spec = {"rule_files": [RULES], "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / "causes_test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, width=100_000))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "SUCCESS" in result.stdout


def test_a_wrong_expectation_fails_so_the_check_is_not_vacuous(tmp_path):
    promtool = need_binary("promtool")
    facts = c.Facts(step_s=4.0, reward_s=3.0)
    (finding,) = expected(facts)
    finding["value"] = 0.5  # Python says 0.75
    spec = {
        "rule_files": [RULES],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": input_series(facts),
                "promql_expr_test": [{"expr": c.RECORD, "eval_time": "1m", "exp_samples": [finding]}],
            }
        ],
    }
    path = tmp_path / "wrong_test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, width=100_000))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "7.5E-01" in result.stdout + result.stderr  # what the rule recorded
