"""Text and JSON renderings of a :class:`~warden.shadow.compare.Comparison`. Pure."""

from __future__ import annotations

from typing import Any

from warden.errors import quote_untrusted
from warden.shadow.compare import Comparison, Divergence


def _steps(steps: tuple[int, ...]) -> str:
    if not steps:
        return "-"
    shown = ", ".join(map(str, steps[:8]))
    return shown + (f", ... ({len(steps)} steps)" if len(steps) > 8 else "")


def verdict_line(comparison: Comparison) -> str:
    first = comparison.first_divergence
    if first is None:
        return f"verdict: within tolerance at all {len(comparison.common_steps)} common steps"
    return f"verdict: DIVERGED first at step {first.step}, metric {first.metric}: {first.detail}"


def render_text(comparison: Comparison, label_a: str, label_b: str) -> str:
    c = comparison
    lines = [
        f"A: {quote_untrusted(label_a)} (run {quote_untrusted(c.run_a) or '?'})",
        f"B: {quote_untrusted(label_b)} (run {quote_untrusted(c.run_b) or '?'})",
        f"common steps: {_steps(c.common_steps)}; only in A: {_steps(c.steps_only_a)}; "
        f"only in B: {_steps(c.steps_only_b)}",
        "",
        f"{'step':>6}  {'metric':<14} {'A':>12} {'B':>12} {'B-A':>11} {'tolerance':>10}  ",
    ]
    for r in c.rows:
        mark = "ok" if r.ok else "DIVERGED"
        lines.append(
            f"{r.step:>6}  {r.metric:<14} {r.a:>12.6g} {r.b:>12.6g} {r.diff:>+11.3g} {r.allowed:>10.3g}  {mark}"
        )
    if c.reward_rows:
        lines += ["", f"{'step':>6}  rewards: two-sample Kolmogorov-Smirnov (scipy.stats.ks_2samp)"]
        for w in c.reward_rows:
            if w.statistic is None or w.p_value is None:
                lines.append(f"{w.step:>6}  n={w.n_a}/{w.n_b}  not judged (fewer than the policy's min_samples)")
            else:
                mark = "ok" if w.ok else "DIVERGED"
                lines.append(
                    f"{w.step:>6}  n={w.n_a}/{w.n_b}  D={w.statistic:.3f}  p={w.p_value:.3g}"
                    f" (min {w.p_value_min:g})  {mark}"
                )
    if c.missing:
        lines += ["", "not compared (a run lacks the metric): " + ", ".join(f"{m}@{s}" for s, m in c.missing[:10])]
    lines += ["", verdict_line(c)]
    return "\n".join(lines)


def _divergence(d: Divergence | None) -> dict[str, Any] | None:
    return None if d is None else {"step": d.step, "metric": d.metric, "detail": d.detail}


def render_json(comparison: Comparison, label_a: str, label_b: str) -> dict[str, Any]:
    c = comparison
    return {
        "a": {"path": label_a, "run_id": c.run_a},
        "b": {"path": label_b, "run_id": c.run_b},
        "ok": c.ok,
        "first_divergence": _divergence(c.first_divergence),
        "divergences": [_divergence(d) for d in c.divergences],
        "metrics": list(c.metrics),
        "common_steps": list(c.common_steps),
        "steps_only_a": list(c.steps_only_a),
        "steps_only_b": list(c.steps_only_b),
        "rows": [
            {"step": r.step, "metric": r.metric, "a": r.a, "b": r.b, "diff": r.diff, "tolerance": r.allowed, "ok": r.ok}
            for r in c.rows
        ],
        "rewards": [
            {
                "step": w.step,
                "n_a": w.n_a,
                "n_b": w.n_b,
                "ks_statistic": w.statistic,
                "p_value": w.p_value,
                "judged": w.judged,
                "ok": w.ok,
            }
            for w in c.reward_rows
        ],
        "missing": [{"step": s, "metric": m} for s, m in c.missing],
    }
