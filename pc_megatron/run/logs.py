"""Run-directory outputs: the row logs (metrics.jsonl and the trackers it feeds, trained.jsonl,
samples.jsonl), the accuracy plot, the summary table."""

from __future__ import annotations

import json
import math
from pathlib import Path

from pc_megatron.files import atomic_write_text
from pc_megatron.run.state import keep_rows_through

EVAL_KEY = "eval_accuracy"


class StepLog:
    """A JSONL file of one object per step (each with a ``step``), appended and flushed row by row.
    ``resume_step``: the rows after it are dropped first (``state.keep_rows_through``)."""

    def __init__(self, path: Path, resume_step: int) -> None:
        self.path = path
        keep_rows_through(path, resume_step)
        self._file = path.open("a", encoding="utf-8")

    def write(self, row: dict) -> None:
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class MetricsLog(StepLog):
    """``metrics.jsonl`` (a ``StepLog``), every row also to the run's trackers (``loggers``)."""

    def __init__(self, run_dir: Path, resume_step: int, trackers) -> None:
        super().__init__(run_dir / "metrics.jsonl", resume_step)
        self.trackers = trackers

    def write(self, row: dict) -> None:
        super().write(row)
        self.trackers.log(row)


class RunLogs:
    """The row streams of a run folder, opened at one resume step: ``metrics.jsonl`` (every row also to
    the trackers), ``trained.jsonl`` (the prompts each step trained) and ``samples.jsonl`` (completions
    shown at each evaluation, also to the trackers)."""

    def __init__(self, run_dir: Path, resume_step: int, trackers) -> None:
        self.trackers = trackers
        self.metrics = MetricsLog(run_dir, resume_step, trackers)
        self.trained = StepLog(run_dir / "trained.jsonl", resume_step)
        self.samples = StepLog(run_dir / "samples.jsonl", resume_step)

    def shown(self, step: int, rows: list[dict]) -> None:
        for sample in rows:
            self.samples.write({"step": step, **sample})
        self.trackers.samples(step, rows)

    def close(self) -> None:
        for log in (self.metrics, self.trained, self.samples):
            log.close()


EVAL_COUNTERS = ("eval/reward_timeouts", "eval/reward_errors")


def benchmark_keys(rows: list[dict]) -> list[str]:
    """The ``eval/<name>`` accuracies of ``eval.sets`` (and ``eval/mean``) in metric rows; not the
    evaluation's reward-failure counters, which share the prefix."""
    return sorted({k for r in rows for k in r if k.startswith("eval/") and k not in EVAL_COUNTERS})


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_accuracy(
    curves: dict[str, list[tuple[float, float]]],
    out: Path,
    target: float | None = None,
    ylabel: str = "held-out accuracy",
) -> None:
    """Held-out accuracy (y) against cumulative rollouts (x), one line per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for label, pts in curves.items():
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
    if target is not None:
        ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:.3f}")
    ax.set_xlabel("cumulative rollouts")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def eval_curve(rows: list[dict]) -> list[tuple[float, float]]:
    return [(r["cum_rollouts"], r[EVAL_KEY]) for r in rows if EVAL_KEY in r]


def format_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 3 + max(len(v) for _, v in rows))
    return "\n".join([line, *(f"{k:<{width}} | {v}" for k, v in rows), line])


POLICY_LABELS = {"grpo": "GRPO", "dapo": "DAPO", "pilot_commit": "Pilot-Commit", "adaptive": "Adaptive"}


def summarize(
    steps_planned: int, policy: str, run_dir: Path, wall_s: float, tracker_failures: dict[str, int] | None = None
) -> dict:
    """From ``metrics.jsonl``: ``summary.json``, the accuracy plot (labelled with the run's
    allocation ``policy``) and the table printed at the end of a run of ``steps_planned`` steps.
    ``tracker_failures``: the calls each tracker failed in this session (``loggers``)."""
    rows = read_metrics(run_dir)
    evals = [r for r in rows if EVAL_KEY in r]
    steps = [r for r in rows if "time_step_s" in r]
    phases = sorted({k for r in steps for k in r if k.startswith("time_") and k != "time_step_s"})
    summary = {
        "steps": steps_planned,
        "initial_eval_accuracy": evals[0][EVAL_KEY] if evals else math.nan,  # none in a profile
        "final_eval_accuracy": evals[-1][EVAL_KEY] if evals else math.nan,
        "best_eval_accuracy": max((r[EVAL_KEY] for r in evals), default=math.nan),
        "cum_rollouts": rows[-1]["cum_rollouts"],
        "cum_generated_tokens": rows[-1]["cum_generated_tokens"],
        "max_logprob_mismatch": max((r.get("logprob_mismatch_max", 0.0) for r in steps), default=0.0),
        "reward_timeouts": sum(r.get("reward/timeouts", 0) for r in steps),
        "reward_errors": sum(r.get("reward/errors", 0) for r in steps),
        "mean_step_s": sum(r["time_step_s"] for r in steps) / max(len(steps), 1),
        "phase_s": {p: sum(r.get(p, 0.0) for r in steps) for p in phases},
        "wall_s": wall_s,
        "tracker_failures": dict(tracker_failures or {}),
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    label = POLICY_LABELS.get(policy, policy)
    if evals:
        sets = benchmark_keys(evals)  # eval.sets, and their mean
        curves = {label: eval_curve(rows)} | {k[5:]: [(r["cum_rollouts"], r[k]) for r in evals if k in r] for k in sets}
        plot_accuracy(curves, run_dir / "eval_accuracy.png")
    table = [
        ("run directory", str(run_dir)),
        ("steps", str(steps_planned)),
        (
            "held-out accuracy",
            f"{summary['initial_eval_accuracy']:.3f} -> {summary['final_eval_accuracy']:.3f} "
            f"(best {summary['best_eval_accuracy']:.3f})",
        ),
        ("cumulative rollouts", f"{summary['cum_rollouts']:,}"),
        ("generated tokens", f"{summary['cum_generated_tokens']:,}"),
        ("reward timeouts / errors", f"{summary['reward_timeouts']} / {summary['reward_errors']}"),
        ("max log-prob mismatch", f"{summary['max_logprob_mismatch']:.2e}"),
        ("mean step time", f"{summary['mean_step_s']:.3f} s"),
        *((p[5:-2], f"{v:.1f} s") for p, v in summary["phase_s"].items()),
        ("wall time", f"{wall_s:.1f} s"),
        *((f"tracker {k}: failed calls", str(v)) for k, v in summary["tracker_failures"].items()),
    ]
    print(format_table(table))
    return summary
