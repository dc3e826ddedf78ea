"""Step time of recipe variants, side by side: each variant is a name and its overrides.

    python tools/bench_variants.py [--recipe tiny] [--steps 12] [--repeats 2] \
        NAME=key=value[,key=value...] NAME=... [-- key=value ...common overrides]

    python tools/bench_variants.py local=runtime=local ray=runtime=ray
    python tools/bench_variants.py fused=algo.old_logprobs=fused separate=algo.old_logprobs=separate

Runs every variant for ``--steps`` steps, alternating (a, b, a, b, ...) so machine noise hits
all alike, and reports per variant the median step time (first two steps excluded: start-up),
the median of each phase and the weight-sync seconds and GB/s; then each variant's step time
as a ratio to the first one's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from pc_megatron.config import load_config
from pc_megatron.observability import read_metrics
from pc_megatron.train import train


def run(recipe: str, overrides: list[str], steps: int, out: Path) -> dict:
    fixed = [f"steps={steps}", "progress=false", "eval.every_steps=1000", "checkpoint.every_steps=0"]
    train(load_config(recipe, [*fixed, *overrides]), out)
    rows = [r for r in read_metrics(out) if "time_step_s" in r][2:]
    phases = sorted({k for r in rows for k in r if k.startswith("time_") and k not in ("time_step_s", "time_eval_s")})
    return {
        "step_s": statistics.median(r["time_step_s"] for r in rows),
        **{p: statistics.median(r.get(p, 0.0) for r in rows) for p in phases},
        "sync_s": statistics.median(r["weight_sync_s"] for r in rows),
        "sync_gbps": statistics.median(r["weight_sync_gbps"] for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="tiny")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("variants", nargs="+", help="NAME=key=value[,key=value...]")
    ap.add_argument("--common", nargs="*", default=[], help="overrides for every variant")
    args = ap.parse_args()
    variants = {}
    for v in args.variants:
        name, _, spec = v.partition("=")
        variants[name] = [s for s in spec.split(",") if s]
    results: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="pcm-bench-") as tmp:
        for r in range(args.repeats):
            for name, overrides in variants.items():
                res = run(args.recipe, [*args.common, *overrides], args.steps, Path(tmp) / f"{name}-{r}")
                results[name].append(res)
                print(json.dumps({"variant": name, "repeat": r, **res}), flush=True)
    med = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in results.items()}
    first = next(iter(med))
    ratios = {f"{name}_over_{first}_step": m["step_s"] / med[first]["step_s"] for name, m in med.items()}
    print(json.dumps({"median": med, **ratios}, indent=2))


if __name__ == "__main__":
    main()
