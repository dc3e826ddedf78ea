"""Run-directory outputs: metrics.jsonl, TensorBoard events, the accuracy plot, the summary
table, and the progress bar."""

from __future__ import annotations

import json
import math
from pathlib import Path

EVAL_KEY = "eval_accuracy"


class MetricsLog:
    """Appends one JSON object per row to ``metrics.jsonl`` and mirrors scalars to TensorBoard.

    Rows after ``resume_step`` (the checkpoint step, or -1 for a fresh start) are dropped first,
    so after a resume the file reads as if the run had never stopped.
    """

    def __init__(self, run_dir: Path, resume_step: int) -> None:
        self.path = run_dir / "metrics.jsonl"
        if self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if json.loads(line)["step"] <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        self._file = self.path.open("a", encoding="utf-8")
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step + 1)

    def write(self, row: dict) -> None:
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                self.tb.add_scalar(k, v, row["step"])

    def close(self) -> None:
        self._file.close()
        self.tb.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_accuracy(curves: dict[str, list[tuple[float, float]]], out: Path, target: float | None = None) -> None:
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
    ax.set_ylabel("held-out accuracy")
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
