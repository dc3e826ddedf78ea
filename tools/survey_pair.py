"""Two or more ``pc-megatron survey`` results of the same prompts and sampling seeds (``--split eval``, before
and after a run: ``--model RUN/checkpoints/step_N/huggingface``), compared paired by prompt: pass@1's change
with a 95% bootstrap interval over the prompts, and each survey's pass@1 and pass@8 by level.

    python tools/survey_pair.py BEFORE/survey.json AFTER/survey.json [AFTER2/survey.json ...]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pc_megatron.stats import percentile_interval


def load(path: Path) -> dict:
    survey = json.loads(path.read_text())
    if "correct" not in survey:
        sys.exit(f"{path}: no per-prompt counts ('correct'); survey again with this version of `pc-megatron survey`")
    return survey


def paired_change(before: dict, after: dict, resamples: int, seed: int) -> tuple[float, tuple[float, float]]:
    """pass@1's change in points, mean over prompts, and its 95% bootstrap interval over the prompts."""
    if len(before["correct"]) != len(after["correct"]) or before["samples"] != after["samples"]:
        raise SystemExit("the surveys differ in prompts or samples: they cannot be paired (same --prompts, --samples)")
    k = before["samples"]
    diffs = [100 * (a - b) / k for a, b in zip(after["correct"], before["correct"], strict=True)]
    rng = random.Random(seed)
    means = [sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(resamples)]
    return sum(diffs) / len(diffs), percentile_interval(means)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path, nargs="+")
    ap.add_argument("--resamples", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    before = load(args.before)
    afters = [load(p) for p in args.after]
    names = ["before", *(p.parent.name for p in args.after)]
    levels = list(before["by_level"])
    print("| level | prompts | " + " | ".join(f"{n} pass@1 | {n} pass@8" for n in names) + " |")
    print("|---|---|" + "---|---|" * len(names))
    for lv in levels:
        cells = [f"{s['by_level'][lv]['pass@1']:.3f} | {s['by_level'][lv]['pass@8']:.3f}" for s in [before, *afters]]
        print(f"| {lv} | {before['by_level'][lv]['prompts']} | " + " | ".join(cells) + " |")
    print()
    for name, after in zip(names[1:], afters, strict=True):
        mean, (lo, hi) = paired_change(before, after, args.resamples, args.seed)
        n = len(after["correct"])
        print(f"{name}: pass@1 {mean:+.1f} points [{lo:+.1f}, {hi:+.1f}] (paired bootstrap over {n} prompts, 95%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
