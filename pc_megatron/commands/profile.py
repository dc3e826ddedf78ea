"""``pc-megatron profile``: a few steps under ``torch.profiler`` with the phase ranges of
``pc_megatron/phases.py`` on."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from pc_megatron.commands import add_recipe_arguments, recipe_and_overrides
from pc_megatron.phases import disable, enable, opened_names

if TYPE_CHECKING:
    from pc_megatron.config import RunConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="torch.profiler over a few steps: trace, per-phase breakdown, memory")
    add_recipe_arguments(p)
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--warmup", type=int, default=2, help="steps run before profiling starts")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for trace.json, breakdown.md/png")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pc_megatron.config import load_config

    cfg = load_config(*recipe_and_overrides(args))
    out = Path(args.out)
    res = profile(cfg, out, args.steps, args.warmup)
    print((out / "breakdown.md").read_text().split("## Top operators")[0].rstrip())
    print(f"\n{out}: trace.json, breakdown.md, breakdown.png (phases = {res['phase_sum_over_step']:.1%} of the step)")
    return 0


class Capture:
    """``torch.profiler`` over steps ``first``..``last`` of a run (``train(..., capture=)``): CPU
    activity, and CUDA activity and memory where there is a GPU; each step is a ``step N`` range."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last, self.prof = first, last, None

    @contextlib.contextmanager
    def step(self, step: int):
        import torch

        if step == self.first:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                torch.cuda.reset_peak_memory_stats()
            self.prof = torch.profiler.profile(activities=activities, profile_memory=True)
            self.prof.start()
        if self.first <= step <= self.last:
            with torch.profiler.record_function(f"step {step}"):
                yield
        else:
            yield
        if step == self.last:
            self.prof.stop()


def profile(cfg: RunConfig, out: Path, steps: int, warmup: int) -> dict:
    """``warmup`` steps, then ``steps`` profiled ones, of the run ``cfg`` describes (its metrics in
    ``out/run``); writes ``out/trace.json`` (Perfetto, chrome://tracing), ``breakdown.md`` and
    ``breakdown.png``. Returns the breakdown's figures."""
    import json
    import resource

    import torch

    from pc_megatron.errors import ConfigError
    from pc_megatron.run.logs import read_metrics
    from pc_megatron.train import train

    if steps < 1 or warmup < 0:
        raise ConfigError(f"profile needs --steps >= 1 and --warmup >= 0 (got {steps}, {warmup})")
    if (out / "run" / "metrics.jsonl").exists():
        raise ConfigError(f"{out} already holds a profile; pass another --out")
    cfg = dataclasses.replace(cfg, steps=warmup + steps, checkpoint=dataclasses.replace(cfg.checkpoint, every_steps=0))
    capture = Capture(warmup + 1, warmup + steps)
    enable()
    try:
        train(cfg, out / "run", capture=capture)
    finally:
        disable()
    trace = out / "trace.json"
    capture.prof.export_chrome_trace(str(trace))
    rows = [r for r in read_metrics(out / "run") if capture.first <= r.get("step", -1) <= capture.last]
    phases = sorted({k[5:-2] for r in rows for k in r if k.startswith("time_") and k != "time_step_s"})
    per_step = [{p: r.get(f"time_{p}_s", 0.0) for p in phases} for r in rows]
    step_s = [r["time_step_s"] for r in rows]
    # what the driver's trace holds of each phase (ranges of actors' processes are in their own traces)
    averages = capture.prof.key_averages()
    in_trace = {e.key: e.cpu_time_total / 1e6 for e in averages if e.key in phases}
    result = {
        "steps": [r["step"] for r in rows],
        "step_s": step_s,
        "phases": {p: [s[p] for s in per_step] for p in phases},
        "phase_sum_over_step": sum(map(sum, (s.values() for s in per_step))) / sum(step_s),
        "trace_phase_s": in_trace,
        # how much of each step the two sides worked (at rollout.max_staleness >= 1 they overlap)
        "learner_busy_s": [r.get("time/learner_busy_s", 0.0) for r in rows],
        "engine_busy_s": [r.get("time/engine_busy_s", 0.0) for r in rows],
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "peak_child_rss_gib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
    }
    (out / "breakdown.json").write_text(json.dumps(result, indent=2))
    _write_breakdown(out, result, _top_operators(averages, set(phases) | opened_names()))
    _plot_breakdown(out / "breakdown.png", result)
    return result


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _top_operators(averages, skip: set[str], k: int = 15) -> list[tuple[str, int, float, float, float]]:
    """(name, calls, self CPU ms, CPU ms, self device ms) of the ``k`` operators with the most
    self CPU time (``averages``: the profiler's ``key_averages()``); the phase and step ranges
    themselves left out."""
    rows = []
    for e in averages:
        if e.key in skip or e.key.startswith("step "):
            continue
        device = getattr(e, "self_device_time_total", 0.0) or 0.0
        rows.append((e.key, e.count, e.self_cpu_time_total / 1e3, e.cpu_time_total / 1e3, device / 1e3))
    return sorted(rows, key=lambda r: -r[2])[:k]


def _write_breakdown(out: Path, res: dict, top: list) -> None:
    total = sum(res["step_s"])
    lines = [
        f"# Step-time breakdown: steps {res['steps'][0]}-{res['steps'][-1]}",
        "",
        f"Mean step {total / len(res['step_s']):.3f} s over {len(res['step_s'])} profiled steps. "
        f"The phases add up to {res['phase_sum_over_step']:.1%} of the step time (the rest: the loop's "
        "own bookkeeping). Phases are exclusive: a phase's time leaves out the phases nested in it.",
        "",
        "| phase | mean s | p50 s | p90 s | share of step |",
        "|---|---|---|---|---|",
    ]
    for p, xs in sorted(res["phases"].items(), key=lambda kv: -sum(kv[1])):
        lines.append(
            f"| {p} | {sum(xs) / len(xs):.4f} | {_quantile(xs, 0.5):.4f} | {_quantile(xs, 0.9):.4f} | "
            f"{sum(xs) / total:.1%} |"
        )
    other = total - sum(map(sum, res["phases"].values()))
    lines.append(f"| (untimed) | {other / len(res['step_s']):.4f} | | | {other / total:.1%} |")
    gpu = "n/a (no GPU)" if res["peak_gpu_gib"] is None else f"{res['peak_gpu_gib']:.2f} GiB (allocated, this process)"
    learner, engine = sum(res["learner_busy_s"]) / total, sum(res["engine_busy_s"]) / total
    lines += [
        "",
        f"Busy: the learner {learner:.0%} of the step (log-probs, training, optimizer, weight sync), the engines "
        f"{engine:.0%} (generating, evaluation included); idle: {1 - learner:.0%} and {1 - engine:.0%}. With "
        "rollout.max_staleness >= 1 the two overlap and the shares can sum past 100%.",
        "",
        f"Peak host RSS: {res['peak_rss_gib']:.2f} GiB (this process), {res['peak_child_rss_gib']:.2f} GiB "
        f"(largest child: engine or reward workers). Peak GPU memory: {gpu}.",
        "",
        "## Top operators (self CPU time, this process, profiled steps)",
        "",
        "| operator | calls | self CPU ms | CPU ms | self device ms |",
        "|---|---|---|---|---|",
        *(f"| `{n}` | {c} | {s:.1f} | {t:.1f} | {d:.1f} |" for n, c, s, t, d in top),
        "",
        "Trace: `trace.json` (open in https://ui.perfetto.dev or chrome://tracing); ranges named after "
        "the phases. Under `runtime=ray` the learner's and engines' ranges are in their actors' processes "
        "(visible with `nsys profile`), not in this trace.",
        "",
    ]
    (out / "breakdown.md").write_text("\n".join(lines))


def _plot_breakdown(path: Path, res: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    x = [str(s) for s in res["steps"]]
    bottom = [0.0] * len(x)
    for p, xs in sorted(res["phases"].items(), key=lambda kv: -sum(kv[1])):
        ax.bar(x, xs, bottom=bottom, label=p)
        bottom = [b + v for b, v in zip(bottom, xs, strict=True)]
    rest = [max(s - b, 0.0) for s, b in zip(res["step_s"], bottom, strict=True)]
    ax.bar(x, rest, bottom=bottom, label="(untimed)", color="lightgray")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title("step time by phase")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
